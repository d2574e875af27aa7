"""numdev-train's configs (installed as numdev.conf.train): its primary config and its own groups."""
