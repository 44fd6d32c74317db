"""Certification: spec, build, probes, sandboxed runs, checks, timing, environment.

This package never imports the registry, the API or the CLI: a certificate is
made without a server.
"""
