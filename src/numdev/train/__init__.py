"""Training glue: the LightningModule, callbacks, weight snapshots, and the numdev-train app."""
