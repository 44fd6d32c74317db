"""kcert.registry."""
