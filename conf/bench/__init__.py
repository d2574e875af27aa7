"""numdev-bench's configs (installed as numdev.conf.bench): its primary config and its own groups."""
