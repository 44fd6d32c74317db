"""kcert.api: the registry's HTTP API (FastAPI), a thin door into :mod:`kcert.registry`."""
