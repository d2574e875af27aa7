"""Hydra configs of numdev (installed as the package numdev.conf)."""
