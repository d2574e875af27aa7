"""numdev's Hydra launcher plugin (hydra/launcher=parallel): the class Hydra finds; numdev.cli.launcher does the work."""
