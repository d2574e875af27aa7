"""Compare this run's weights with a sibling (reference) run's at every snapshot step, live.

The sibling is another run directory: a path, or in a study an interpolation into the same
multirun (`${run_dir}/../reference`). The callback listens to the snapshot callback
(numdev.train.callbacks.snapshots): at each step this run snapshots (step 0, every snapshot.every_n_steps,
the final step) it gets the same gathered float32 state, loads the sibling's snapshot of that step
(verified against its sha256), computes every metric of numdev.weights.distances per weight set
and for the model (the token-embedding rows neither run's captions index, from both runs'
token_rows.json, are their own set), and logs them to TensorBoard:

    distance/<label>/<metric>                                  the model row (numdev.runs.layout.MODEL_ROW)
    per_tensor/<label>/<set>/<metric>                          per weight set (per_tensor=true only: the CSV has them)
    sibling_diff/<label>/model, sibling_diff/<label>/<tensor>   histograms of the differences (sampled)

(`distance/` sorts first among TensorBoard's groups, so the distances are the first cards; the
label is the reference directory's name, or "reference" where that name is a timestamp or a job number.)

and keeps the rows in <run_dir>/sibling/<label>.csv (numdev.weights.metrics.DISTANCE_COLUMNS, the
columns of numdev-compare's CSV). `seconds` keeps what each comparison cost.

Cost: a sibling that writes its sorted values (snapshot.sorted_values=true, the study's reference) is
not sorted again here: its weights/sorted_XXXXXXXX.safetensors is read and checked against its
verified snapshot (numdev.weights.distances.prepare). A file that is missing, stale or fails a
check is set aside and the sibling's values are sorted here (said once in the log): the rows are
the same bits either way. Only this run's own sets that changed since its previous snapshot are
sorted, and only sets changed on either side are compared again (CompareCache).

Resuming never drops a row: the rows up to the checkpoint's step are kept (the steps after it are
retraced), and a step the run has a snapshot of but no row for (a kill between the two, a CSV of
an older format) is computed from the two runs' snapshot files.

A sibling training in parallel (a parallel launcher, SLURM) may not have reached the step yet:
the callback polls for the snapshot up to `timeout_s` seconds. It stops waiting with a clear
error when the sibling has finished or failed without that step (a different step grid or
length), when it is dead (its run.json says "running" but no process holds its run lock, twice
in a row: killed without a word, numdev.runs.lock), when its parameters differ in names or shapes
(a different architecture), or when the snapshot fails its checksum (numdev.weights.store names
the file). SIGTERM while it waits ends the run as it does during training (run.json "failed").
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from numdev.runs.atomic import write_text
from numdev.runs.layout import RunDir, indexed_rows
from numdev.runs.lock import is_held
from numdev.train.trackers import drawing, log_metrics
from numdev.weights.distances import CompareCache, Prepared, check_same_architecture, compare, distance_rows, prepare
from numdev.weights.metrics import distances_to_csv, read_distances_csv
from numdev.weights.store import (
    SnapshotError,
    SortedValuesError,
    list_snapshots,
    load_snapshot,
    load_snapshot_entry,
    open_sorted_values,
)

log = logging.getLogger(__name__)
FINISHED = ("finished", "failed", "stopped")
HISTOGRAM_VALUES = 1 << 18
STARTUP_GRACE_S = 60.0  # how long a reference directory may hold no run record and no live run lock (a run starting up)


def default_label(reference: Path) -> str:
    """The comparison's name: the reference directory's, unless that is a timestamp or a job number
    (outputs/train/default/2026-01-01_12-00-00_..., <sweep>/0), which says nothing: then "reference"."""
    name = reference.name
    return "reference" if re.match(r"\d{4}-\d{2}-\d{2}_|\d+$", name) else name


class SiblingError(ValueError):
    """The sibling run is missing, not a run, or does not match this one: the message says which and how."""


class SiblingDistance(pl.Callback):
    def __init__(
        self,
        run_dir: str,
        reference: str | None,
        label: str | None = None,
        timeout_s: float = 3600.0,
        poll_s: float = 1.0,
        histograms: str = "model",  # "model", "all" (also per tensor) or "none"
        threads: int | None = None,  # for sorting and the metrics; None: torch's intra-op threads
        per_tensor: bool = False,  # also every weight set's distances in TensorBoard (hundreds of cards; the CSV has them)
    ):
        self.run_dir = Path(run_dir)
        self.reference = Path(reference) if reference is not None else None
        if histograms not in ("model", "all", "none"):
            raise ValueError(f"sibling.histograms={histograms!r}: choose model, all or none")
        if timeout_s < 0:
            raise ValueError(f"sibling.timeout_s={timeout_s} must be >= 0")
        self.timeout_s, self.poll_s, self.histograms, self.threads = timeout_s, poll_s, histograms, threads
        self.label = label or (default_label(self.reference) if self.reference is not None else "")
        self.per_tensor = per_tensor
        self.rows: list[dict] = []
        self.seconds: list[float] = []
        # The latest prepared (sorted) weights of each side: a set unchanged since then is not sorted again.
        self._reference: tuple[tuple, Prepared] | None = None  # ((step, sha256, rows), prepared reference)
        self._mine: Prepared | None = None
        self._cache = CompareCache()
        self.hub = None  # the run's WeightSnapshots, set by numdev.train.callbacks.connect
        self.stored_problem: str | None = None  # why the sibling's sorted values were last set aside (said once)
        self._trainer = None  # for its SIGTERM flag while waiting
        self._seen_dead = False  # the sibling looked dead at the previous poll
        self._no_run_since: float | None = None  # since when the reference has had no run record and no live lock

    @property
    def active(self) -> bool:
        return self.reference is not None

    @property
    def csv_path(self) -> Path:
        return RunDir(self.run_dir).sibling_csv(self.label)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.active:
            return
        if self.reference.resolve() == self.run_dir.resolve():
            raise SiblingError(f"sibling.reference={self.reference} is this run itself: name another run directory")
        if not self.reference.exists() and not self.reference.parent.exists():
            raise SiblingError(
                f"sibling.reference={self.reference} does not exist (nor does its parent directory): "
                "give the directory of a numdev-train run"
            )
        if not self.reference.exists() and not self.made_by_own_sweep():
            # Nothing is going to create it: waiting sibling.timeout_s (an hour) for it would only delay this error.
            raise SiblingError(
                f"sibling.reference={self.reference} does not exist, and no job of this run's sweep makes it: give the "
                "directory of a numdev-train run (start the reference first, or run both roles in one sweep)"
            )
        if self.hub is None:
            raise SiblingError("callbacks.sibling compares at the snapshot steps: it needs callbacks.snapshots (do not set it to null)")
        self._trainer = trainer

    def made_by_own_sweep(self) -> bool:
        """The reference lies in this run's own sweep directory (a study's role beside this one): a job of the
        sweep makes it, possibly after this one starts (numdev.config.preflight checked that one does)."""
        try:
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
                return False
            sweep = Path(str(HydraConfig.get().sweep.dir)).resolve()
        except Exception:  # noqa: BLE001 - no Hydra here (a test, a script): a single run
            return False
        reference = self.reference.resolve()
        return reference != sweep and reference.is_relative_to(sweep)

    def attach_to(self, hub) -> None:
        """Listen to the run's snapshot hub (numdev.train.callbacks.connect); an inactive comparison does not."""
        if self.active and hub is not None:
            hub.subscribe(self)
            self.hub = hub

    def results(self) -> dict:
        if not self.seconds:
            return {}
        return {"sibling_seconds": {"mean": sum(self.seconds) / len(self.seconds), "count": len(self.seconds)}}

    # -- the snapshot callback's listener -------------------------------------------------------------

    def on_snapshot(self, trainer, pl_module, step: int, state: dict[str, torch.Tensor], prepared: Prepared | None = None) -> None:
        if not self.active:
            return
        start = time.perf_counter()
        distances, mine, theirs = self.measure(step, state, prepared)
        self.rows = [r for r in self.rows if r["step"] != step] + distance_rows(step, distances)
        self.write_rows()
        self.seconds.append(time.perf_counter() - start)
        self.log_distances(trainer, step, distances, mine, theirs)

    def on_resume(self, trainer, pl_module, step: int) -> None:
        """Keep the rows up to the resumed step; compute those the run has snapshots but no rows for."""
        if not self.active:
            return
        rows = []
        if self.csv_path.exists():
            try:
                rows = read_distances_csv(self.csv_path)
            except ValueError as error:  # an older format, or damaged: the snapshots hold the truth
                log.info("[sibling] %s; recomputing its rows from the snapshots", error)
        self.rows = [r for r in rows if r["step"] <= step]
        have = {r["step"] for r in self.rows}
        missing = [s for s in list_snapshots(self.run_dir) if s <= step and s not in have]
        for s in missing:
            distances, _, _ = self.measure(s, load_snapshot(self.run_dir, s))
            self.rows.extend(distance_rows(s, distances))
        self.rows.sort(key=lambda r: r["step"])
        self.write_rows()
        if missing:
            log.info("[sibling] %s: computed the rows of steps %s from the snapshots", self.csv_path, missing)

    # -- the comparison ---------------------------------------------------------------------------------

    def measure(self, step: int, state: dict[str, torch.Tensor], own: Prepared | None = None) -> tuple[dict, dict, dict]:
        """Distances of `state` (this run at `step`) to the sibling's snapshot of `step`; `own`: the same
        weights already sorted by the snapshot hub (snapshot.sorted_values), reused when split alike."""
        theirs, sha256 = self.wait_for(step)
        check_same_architecture(state, theirs, where=f"sibling {self.reference} at step {step}")
        rows = indexed_rows([RunDir(self.run_dir).read_token_rows(), RunDir(self.reference).read_token_rows()], step)
        key = (step, sha256, _rows_key(rows))
        if self._reference is None or self._reference[0] != key:
            previous = self._reference[1] if self._reference is not None else None
            self._reference = (key, self.prepare_reference(step, sha256, theirs, rows, previous))
        # This run's own sorts, when its snapshot callback wrote them (snapshot.sorted_values) with the same split.
        previous = own if own is not None and _rows_key(own.rows) == _rows_key(rows) else self._mine
        self._mine = prepare(state, rows, self.threads, previous)
        distances = compare(self._mine, self._reference[1], self.threads, self._cache)
        return distances, state, theirs

    def prepare_reference(self, step: int, sha256: str, theirs: dict, rows, previous: Prepared | None) -> Prepared:
        """The sibling's Prepared, its sorts read from its sorted-values file where that passes every check."""
        try:
            stored = open_sorted_values(self.reference, step, sha256)
        except SortedValuesError as error:
            prepared = prepare(theirs, rows, self.threads, previous)
            problem = str(error)
        else:
            with stored:
                prepared = prepare(theirs, rows, self.threads, previous, stored)
            problem = prepared.stored_problem
        if problem is not None and self.stored_problem is None:
            log.debug("[sibling] not using the sibling's sorted values (%s); sorting its values here instead "
                      "(the same results, slower; said once)", problem)
        if problem is not None:
            self.stored_problem = problem
        return prepared

    def write_rows(self) -> None:
        write_text(self.csv_path, distances_to_csv(self.rows))

    def log_distances(self, trainer, step: int, distances: dict, mine: dict, theirs: dict) -> None:
        if not trainer.loggers:
            return
        label = self.label
        metrics = {f"distance/{label}/{k}": v for k, v in distances["model"].items() if k != "numel"}
        for name, values in distances["per_tensor"].items() if self.per_tensor else ():
            metrics.update({f"per_tensor/{label}/{name}/{k}": v for k, v in values.items() if k not in ("numel", "pooled_wasserstein")})
        log_metrics(trainer, metrics, step=step)
        experiment = drawing(trainer)
        if self.histograms != "none" and hasattr(experiment, "add_histogram"):
            self.log_histograms(experiment, step, mine, theirs)

    def log_histograms(self, experiment, step: int, mine: dict, theirs: dict) -> None:
        """Histograms of the differences, each of at most HISTOGRAM_VALUES of them at a fixed stride
        (a picture: the exact numbers are the CSV's; TensorBoard's binning costs more than the comparison)."""
        names = sorted(mine)
        total = sum(mine[n].numel() for n in names)
        stride = max(1, -(-total // HISTOGRAM_VALUES))
        diff = torch.cat([(mine[n].flatten()[::stride] - theirs[n].flatten()[::stride]) for n in names])
        experiment.add_histogram(f"sibling_diff/{self.label}/model", diff, global_step=step)
        if self.histograms == "all":
            for name in names:
                stride = max(1, -(-mine[name].numel() // HISTOGRAM_VALUES))
                values = mine[name].flatten()[::stride] - theirs[name].flatten()[::stride]
                experiment.add_histogram(f"sibling_diff/{self.label}/{name}", values, global_step=step)

    # -- waiting for the sibling ------------------------------------------------------------------------

    def wait_for(self, step: int) -> tuple[dict[str, torch.Tensor], str]:
        """The sibling's snapshot at `step` and its sha256, waiting up to timeout_s for it to be written."""
        start = time.monotonic()
        announced = 0.0
        while True:
            loaded = self._try_load(step)
            if loaded is not None:
                return loaded
            waited = time.monotonic() - start
            if waited >= self.timeout_s:
                raise SiblingError(
                    f"sibling {self.reference}: no snapshot at step {step} after waiting {self.timeout_s:g} s "
                    f"({self._describe()}); is the sibling running? raise sibling.timeout_s or compare offline "
                    "with numdev-compare when both runs are done"
                )
            if waited - announced >= 30:
                announced = waited
                log.info("[sibling] waiting for %s step %d (%.0f of %g s)", self.reference, step, waited, self.timeout_s)
            self._sleep(self.poll_s)

    def _sleep(self, seconds: float) -> None:
        """Sleep in short slices; Lightning's SIGTERM handler only sets a flag, checked between them."""
        end = time.monotonic() + seconds
        while True:
            if getattr(self._trainer, "received_sigterm", False):
                raise SIGTERMException
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))

    def _try_load(self, step: int) -> tuple[dict[str, torch.Tensor], str] | None:
        self._check_alive(step)
        if not RunDir(self.reference).index.is_file():
            # A sibling still starting up has a run.json before its first snapshot: wait for it.
            if self._status() in FINISHED:
                raise SiblingError(f"sibling {self.reference} is a run without snapshots ({RunDir(self.reference).index} missing)")
            self._check_is_a_run()
            return None
        steps = list_snapshots(self.reference)
        if step in steps:
            return load_snapshot_entry(self.reference, step)
        status = self._status()
        if status == "failed":
            raise SiblingError(
                f"sibling {self.reference} failed before step {step} ({self._error()}): this run cannot be compared "
                f"past step {max(steps) if steps else 0}; continue the sibling (resume=auto), then this run"
            )
        if status in FINISHED or (steps and max(steps) > step):
            raise SiblingError(
                f"sibling {self.reference} ({status or 'running'}) has no snapshot at step {step}; it has steps "
                f"{_steps_text(steps)}: the runs must share trainer.max_steps, snapshot.every_n_steps and snapshot.schedule"
            )
        return None

    def _check_is_a_run(self) -> None:
        """A reference directory with no run record whose run lock no process holds, for STARTUP_GRACE_S (a run
        starting up takes its lock within seconds), outside this run's sweep: not a run, and none is coming
        (an empty directory, a sweep's directory instead of one of its runs)."""
        if RunDir(self.reference).record.is_file() or is_held(self.reference) or self.made_by_own_sweep():
            self._no_run_since = None
            return
        now = time.monotonic()
        if self._no_run_since is None:
            self._no_run_since = now
        elif now - self._no_run_since >= STARTUP_GRACE_S:
            raise SiblingError(
                f"sibling.reference={self.reference} is not a numdev-train run: it has no run.json and no process has held "
                f"its run lock for {STARTUP_GRACE_S:g} s, so no snapshot will come; give the directory of a run "
                "(not of a sweep: one of its runs, e.g. .../r0/reference)"
            )

    def _check_alive(self, step: int) -> None:
        """A sibling whose run.json says "running" while no process holds its run lock was killed
        without a word (a live run writes its final record before it lets the lock go, so the lock is
        probed first). Seen at two polls in a row (a resumed sibling takes the lock at once)."""
        dead = not is_held(self.reference) and self._status() == "running"
        if dead and self._seen_dead:
            raise SiblingError(
                f"sibling {self.reference} is dead: its run.json says running but no process holds its run lock "
                f"(killed?), so its snapshot of step {step} will never come; continue it with resume=auto, then this run"
            )
        self._seen_dead = dead

    def _record(self) -> dict:
        try:
            record = json.loads(RunDir(self.reference).record.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return {}
        return record if isinstance(record, dict) else {}

    def _status(self) -> str | None:
        status = self._record().get("status")
        return status if isinstance(status, str) else None

    def _error(self) -> str:
        return str(self._record().get("error") or "its run.json names no error")[:200]

    def _describe(self) -> str:
        if not self.reference.exists():
            return "the directory does not exist yet"
        try:
            steps = list_snapshots(self.reference)
        except SnapshotError:
            return "it has no snapshot index yet"
        return f"its latest snapshot is step {max(steps)}" if steps else "it has no snapshots yet"


def _rows_key(rows: dict[str, np.ndarray] | None) -> tuple:
    return tuple((name, ids.tobytes()) for name, ids in sorted(rows.items())) if rows else ()


def _steps_text(steps: list[int]) -> str:
    if len(steps) <= 6:
        return str(steps)
    return f"[{steps[0]}, {steps[1]}, ..., {steps[-1]}] ({len(steps)})"
