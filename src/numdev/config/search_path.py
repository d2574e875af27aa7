"""How Hydra finds the config groups both apps share.

Each app composes from its own root, numdev.conf.<app> (conf/bench/, conf/train/: its primary
config and its own groups); the groups both use, `attention` and numdev's `hydra/` options
(launchers, logging, help), live once in conf/ (numdev.conf). This search-path plugin adds
pkg://numdev.conf behind an app's own root, for numdev's apps only: a user's
hydra.searchpath=[file://...] on the command line adds to it instead of replacing it.

Hydra finds plugins by scanning the hydra_plugins package (hydra_plugins/numdev_launcher holds a
reference to this one), which an editable install (pip install -e) hides from that scan, so
`register()` also registers it through Hydra's public API when numdev is imported.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

SHARED = "pkg://numdev.conf"


class SharedConfigs(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        paths = [element.path for element in search_path.get_path()]
        if SHARED not in paths and any(str(p).startswith(f"{SHARED}.") for p in paths):
            search_path.append(provider="numdev", path=SHARED)


def register() -> None:
    from hydra.core.plugins import Plugins

    Plugins.instance().register(SharedConfigs)
