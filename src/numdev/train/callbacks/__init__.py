"""The training callbacks (conf/train/callbacks/default.yaml lists them), and how they are wired.

Two contracts, both explicit:

  - the snapshot hub: `WeightSnapshots` gathers the weights once per snapshot step and hands them to
    its listeners (`SnapshotListener`: the sibling comparison). `connect` subscribes every listener
    to the run's hub when the trainer is built (numdev.train.run.build_trainer); no callback looks
    for another.
  - what a callback adds to run.json: each that has something to say implements `results()`, a dict
    merged into the record at the end of the run (`ReportsResults`), in the order of the callbacks.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ReportsResults(Protocol):
    def results(self) -> dict:
        """The fields this callback adds to run.json (empty when it has nothing to say)."""
        ...


def connect(callbacks: list) -> None:
    """Subscribe every snapshot listener to the run's WeightSnapshots (None when callbacks.snapshots=null:
    a listener that needs it says so in one line when the run starts)."""
    from numdev.train.callbacks.snapshots import WeightSnapshots

    hub = next((c for c in callbacks if isinstance(c, WeightSnapshots)), None)
    for callback in callbacks:
        if hasattr(callback, "attach_to"):
            callback.attach_to(hub)


def results(callbacks: list) -> dict:
    """The run.json fields of every callback that reports some (ReportsResults), in callback order."""
    out: dict = {}
    for callback in callbacks:
        if isinstance(callback, ReportsResults):
            out.update(callback.results())
    return out
