"""The ``kcert`` command line: thin doors into the libraries."""

from kcert.cli.app import app, main

__all__ = ["app", "main"]
