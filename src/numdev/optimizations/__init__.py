"""Training optimizations applied to a run as a user applies them (conf/train/optimization/, one file each).

`optimization=<name>` picks one; numdev.train.run applies it through the hooks of
numdev.optimizations.base.Optimization (process settings, the attention backend, the model, the
optimizer) and records what it found active in run.json (`optimization`). One module per
optimization that needs code; docs/optimizations.md has the catalogue and the recipe to add one.
"""

from numdev.optimizations.base import Optimization

__all__ = ["Optimization"]
