"""numdev-report: a self-contained HTML page of the regenerated figures."""
