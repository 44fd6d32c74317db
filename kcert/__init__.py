"""kcert: certify GPU kernels against adversarial probes and gate their deployment."""

__version__ = "0.1.0"
