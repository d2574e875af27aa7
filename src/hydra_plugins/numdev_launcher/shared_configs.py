"""numdev's search-path plugin where Hydra's plugin scan looks for it (numdev.config.search_path)."""

from numdev.config.search_path import SharedConfigs  # noqa: F401
