"""Signed kernel certificates.

``keys`` makes and loads Ed25519 keys; ``dsse`` is the envelope and its PAE
signature; ``statement`` the in-toto Statement v1 and the predicate's JSON
Schema; ``certificate`` signs reports and verifies certificates; ``diff``
compares two of them. Nothing here imports the CLI, the API or the registry.
"""
