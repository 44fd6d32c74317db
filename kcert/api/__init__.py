"""kcert.api."""
