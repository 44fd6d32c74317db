"""kcert.log."""
