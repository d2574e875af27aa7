"""The project's own GPU kernels (Triton), installed as numdev.kernels."""
