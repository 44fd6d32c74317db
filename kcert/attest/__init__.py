"""kcert.attest."""
