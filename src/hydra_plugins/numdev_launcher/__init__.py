"""numdev's Hydra launcher plugin (hydra/launcher=parallel): the class Hydra finds; numdev.launcher does the work."""
