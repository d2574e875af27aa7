"""The layout of every directory numdev writes: each file's name, and the columns of its tables.

One home for the contract that bench/ and train/ write and analysis/ and report/ read
(docs/run_layout.md). A training run:

    <run_dir>/config.yaml               the resolved config
    <run_dir>/run.json                  what ran, and how it ended
    <run_dir>/weights/index.json        the snapshot index (numdev.weights.store)
    <run_dir>/weights/step_XXXXXXXX.safetensors
    <run_dir>/weights/sorted_XXXXXXXX.safetensors   the snapshot's values sorted (snapshot.sorted_values=true)
    <run_dir>/token_rows.json           the token-embedding rows the run's captions index
    <run_dir>/sibling/<label>.csv       weight distances to a sibling run (numdev.weights.metrics)
    <run_dir>/checkpoints/last.ckpt     the resume checkpoint
    <run_dir>/checkpoints/last.ckpt.sha256   its checksum (numdev.train.checkpoint_io)
    <run_dir>/instability.json, shadow.csv, eval.json, samples.png
    <run_dir>/heldout.json              the held-out loss (numdev.train.callbacks.heldout)
    <run_dir>/heldout_predictions.safetensors   the model's predictions on the held-out inputs (its sha256 in heldout.json)
    <run_dir>/<overrides>/events.out.tfevents.*   TensorBoard (numdev.train.tensorboard; a study: in <run_dir>)

A study (a numdev-train sweep with a `study` block) or a bench sweep (Hydra's sweep directory):

    <sweep>/multirun.yaml               Hydra's record of the sweep (its task overrides)
    <sweep>/<job>/.hydra/overrides.yaml, config.yaml   Hydra's record of each job
    <study>/summary.json                the study's analysis (numdev.analysis.study)
    <study>/fig7.png, fig8.png, loss_curves.png, downstream.png   its figures (numdev.figures.study)
    <bench job>/results.jsonl           one record per line (numdev.bench.app); interrupted.json while stopped
    <bench sweep>/table.csv, <figure>.png, <figure>.json   the gathered records and the figure (numdev-figure)
    <compare out>/distances.csv, distances.png, compare.json   numdev-compare's output

Nothing here imports train/ or analysis/: both import this.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy

from numdev.runs import schemas, tables
from numdev.runs.atomic import read_bounded, write_bytes

CONFIG = "config.yaml"
RUN_RECORD = "run.json"
WEIGHTS_DIR = "weights"
INDEX = "index.json"
INDEX_FORMAT = 1
# weights/sorted_XXXXXXXX.safetensors: a snapshot's weight sets sorted, written by a run that others
# compare with (snapshot.sorted_values=true) so that they need not sort its values again
# (numdev.weights.store.write_sorted_values; docs/run_layout.md#sorted-values).
SORTED_FORMAT = 1
POOLED = "__pooled__"
# A snapshot index entry's "stored" (docs/run_layout.md#snapshots): FULL, every parameter whole; TRAINED,
# every parameter whole except the token embedding, of which only the rows the captions index are
# stored (tensor `<name>`, shape (k, width)), their ids beside them (tensor `<name>` + ROWS_SUFFIX,
# int64); the other rows are those of the entry's "base_step" snapshot (step 0, always FULL), checked
# equal when the snapshot was written. Written only where it saves disk (snapshot.trained_only).
FULL, TRAINED = "full", "trained"
ROWS_SUFFIX = "::rows"  # the tensor of a sorted-values file that holds every value of the model, sorted
CHECKPOINT = Path("checkpoints") / "last.ckpt"
CHECKPOINT_DIGEST_SUFFIX = ".sha256"  # beside every checkpoint: {"sha256": ..., "previous": ...}
TOKEN_ROWS = "token_rows.json"
SIBLING_DIR = "sibling"
INSTABILITY = "instability.json"
SHADOW_CSV = "shadow.csv"
EVAL = "eval.json"
HELDOUT = "heldout.json"
# heldout_predictions.safetensors: tensor PREDICTION_TENSOR, float32 (images, C, H, W), the model's
# output on the held-out inputs (the same images, timesteps and noise as the loss); metadata
# {"numdev": JSON {"format", "step", "images", "seed"}}. heldout.json's "predictions" names the file
# with its sha256, shape and size; written first, so a heldout.json that names it finds it whole.
HELDOUT_PREDICTIONS = "heldout_predictions.safetensors"
HELDOUT_PREDICTIONS_FORMAT = 1
PREDICTION_TENSOR = "prediction"
SAMPLES = "samples.png"
CONTINUATIONS = "continuations.json"  # a language model's greedy continuations of fixed prompts (numdev.train.callbacks.continuations)
TENSORBOARD = "tensorboard"

# Sweeps and studies (Hydra writes the first three).
MULTIRUN = "multirun.yaml"
HYDRA_DIR = ".hydra"
HYDRA_OVERRIDES = "overrides.yaml"
SUMMARY = "summary.json"
FIG7, FIG8, LOSS_CURVES, DOWNSTREAM = "fig7.png", "fig8.png", "loss_curves.png", "downstream.png"
# numdev-bench and numdev-figure.
RESULTS = "results.jsonl"
INTERRUPTED = "interrupted.json"  # beside results.jsonl while a job stopped by a signal is not completed
TABLE = "table.csv"
# numdev-compare.
DISTANCES_CSV, DISTANCES_PNG, COMPARE_JSON = "distances.csv", "distances.png", "compare.json"

# The sibling CSV and numdev-compare's distances.csv: one row per step and weight set.
# `tensor` is a parameter name (its trained values), `<name>[unindexed]` (token-embedding rows no
# caption indexes), or MODEL_ROW (the aggregate over the trained values; numdev.weights.distances
# defines every column).
MODEL_ROW = "__model__"
UNINDEXED_SUFFIX = "[unindexed]"

# shadow.csv (numdev.train.callbacks.shadow): per-call deviation of the shadow attention backend
# (numdev.models.shadow defines each column). The columns from `bias` on were added later: a file
# written before them reads with None there.
SHADOW_COLUMNS = {"step": int, "layer": str, "quantity": str, "max_abs": float, "mean_abs": float, "ref_max_abs": float,
                  "bias": float, "rel_rms": float, "diff_rms": float, "shadow_rms": float, "count": int}
SHADOW_ADDED = ("bias", "rel_rms", "diff_rms", "shadow_rms", "count")


def sweep_run_records(sweep: str | Path) -> list[Path]:
    """The run.json of every run of a numdev-train sweep, sorted: a plain sweep's runs are <sweep>/<job>/, a study's
    <sweep>/r<replicate>/<role>/."""
    sweep = Path(sweep)
    return sorted({*sweep.glob(f"*/{RUN_RECORD}"), *sweep.glob(f"*/*/{RUN_RECORD}")})


def snapshot_name(step: int) -> str:
    return f"step_{int(step):08d}.safetensors"


def sorted_values_name(step: int) -> str:
    return f"sorted_{int(step):08d}.safetensors"


@dataclass(frozen=True)
class RunDir:
    """A training run's directory as one object: the path of every file numdev writes there, and a
    checked reader for each (a damaged, truncated or forged file is one ValueError naming it).

        run = RunDir(run_dir)
        run.record, run.config, run.index, run.snapshot(step), run.sibling_csv(label), ...
        run.read_record(), run.read_study_config(), run.read_token_rows(), run.read_shadow(), ...
    """

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    # -- where each file is ----------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def record(self) -> Path:
        return self.path / RUN_RECORD

    @property
    def weights(self) -> Path:
        return self.path / WEIGHTS_DIR

    @property
    def index(self) -> Path:
        return self.weights / INDEX

    def snapshot(self, step: int) -> Path:
        return self.weights / snapshot_name(step)

    def sorted_values(self, step: int) -> Path:
        return self.weights / sorted_values_name(step)

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    @property
    def token_rows(self) -> Path:
        return self.path / TOKEN_ROWS

    def sibling_csv(self, label: str) -> Path:
        return self.path / SIBLING_DIR / f"{label}.csv"

    @property
    def instability(self) -> Path:
        return self.path / INSTABILITY

    @property
    def shadow_csv(self) -> Path:
        return self.path / SHADOW_CSV

    @property
    def eval(self) -> Path:
        return self.path / EVAL

    @property
    def heldout(self) -> Path:
        return self.path / HELDOUT

    @property
    def heldout_predictions(self) -> Path:
        return self.path / HELDOUT_PREDICTIONS

    @property
    def samples(self) -> Path:
        return self.path / SAMPLES

    def events(self) -> Path | None:
        """The directory holding the run's TensorBoard event files: the run directory itself (a study),
        the directory named by its overrides below it (numdev.train.tensorboard), or tensorboard/ (older runs)."""
        places = [self.path, *sorted(p for p in self.path.iterdir() if p.is_dir())] if self.path.is_dir() else []
        return next((p for p in places if any(p.glob("events.out.tfevents.*"))), None)

    # -- what each file holds, checked ---------------------------------------------------------------
    def read_record(self) -> dict:
        """run.json (the resumes list's entries checked too)."""
        return schemas.read_json_file(self.record, schemas.RUN_RESUMES)

    def read_study_config(self) -> dict:
        """config.yaml with its `study` block checked (a study role's run)."""
        return schemas.read_study_config(self.config)

    def read_instability(self) -> dict:
        return schemas.read_json_file(self.instability, schemas.INSTABILITY)

    def read_outcome(self, key: str) -> float | None:
        """eval.json (colour/shape/position agreement) or heldout.json (heldout_loss), by the key asked for."""
        return schemas.read_outcome(self.heldout if key in ("heldout_loss", "unigram_entropy") else self.eval, key)

    def read_heldout(self) -> dict:
        """heldout.json as the function-level comparisons read it: step, loss, images, seed (and, from
        runs that wrote them, the inputs' sha256 and the predictions' entry)."""
        return schemas.read_json_file(self.heldout, schemas.HELDOUT_RECORD)

    def read_heldout_predictions(self) -> tuple[np.ndarray, dict]:
        """(predictions, heldout.json): the float32 (images, C, H, W) array, verified against the
        sha256, shape and size heldout.json records for it; one ValueError naming the file otherwise."""
        record = self.read_heldout()
        entry = record.get("predictions")
        if entry is None:
            raise ValueError(f"{self.heldout} records no held-out predictions: the run was made with "
                             "callbacks.heldout.save_predictions=false or before numdev wrote them")
        path = self.heldout_predictions
        if entry["file"] != HELDOUT_PREDICTIONS:
            raise ValueError(f"{self.heldout}: 'predictions.file' is {entry['file']!r}, not {HELDOUT_PREDICTIONS!r}: the record was edited")
        if not path.is_file():
            raise ValueError(f"{path} is missing (named in {HELDOUT})")
        size = path.stat().st_size
        if size != entry["bytes"]:  # checked before the file is read: an extended (sparse) file is never read whole
            raise ValueError(f"{path}: {size} bytes, not the {entry['bytes']} {HELDOUT} records: the file is truncated, "
                             "extended or was changed after it was written")
        data = path.read_bytes()
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"{path}: {len(data)} bytes whose sha256 does not match {HELDOUT}'s: the file is corrupt, "
                             "truncated or was changed after it was written")
        try:
            tensors = safetensors.numpy.load(data)
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"{path}: not a safetensors file ({type(error).__name__})") from None
        values = tensors.get(PREDICTION_TENSOR)
        shape = list(values.shape) if values is not None else None
        if values is None or values.dtype != np.float32 or shape != entry["shape"] or len(shape) < 1 or shape[0] != record["images"]:
            raise ValueError(f"{path}: no float32 tensor {PREDICTION_TENSOR!r} of shape {entry['shape']} "
                             f"({record['images']} images): not this run's held-out predictions")
        return values, record

    @property
    def continuations(self) -> Path:
        return self.path / CONTINUATIONS

    def read_continuations(self) -> dict:
        """continuations.json (a language model's greedy continuations of fixed prompts), checked."""
        record = schemas.read_json_file(self.continuations, schemas.CONTINUATIONS)
        for i, sample in enumerate(record["samples"]):
            schemas.CONTINUATION_ENTRY.check(self.continuations, sample, f"samples[{i}].")
        return record

    def read_samples(self) -> dict:
        """eval.json with its per-sample classes checked (each entry null or {caption, colour, shape, position})."""
        record = schemas.read_json_file(self.eval, schemas.SAMPLE_SCORES)
        for i, sample in enumerate(record["samples"]):
            if sample is not None:
                schemas.SAMPLE_ENTRY.check(self.eval, sample, f"samples[{i}].")
        return record

    def read_shadow(self) -> list[dict]:
        return read_shadow_csv(self.shadow_csv)

    def read_token_rows(self) -> dict | None:
        """token_rows.json, validated; None if the run has none (a run made before it existed)."""
        path = self.token_rows
        if not path.is_file():
            return None
        try:
            record = json.loads(read_bounded(path, what="token-rows record").decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not valid JSON ({error}): delete it and resume the run to write it again") from None
        problem = token_rows_problem(record)
        if problem:
            raise ValueError(f"{path}: {problem}: the file is corrupt or was not written by numdev")
        return record


def write_heldout_predictions(run_dir: str | Path, predictions: np.ndarray, step: int, images: int, seed: int) -> dict:
    """Write <run_dir>/heldout_predictions.safetensors atomically; returns heldout.json's entry for it."""
    values = np.ascontiguousarray(predictions, dtype=np.float32)
    meta = {"format": HELDOUT_PREDICTIONS_FORMAT, "step": int(step), "images": int(images), "seed": int(seed)}
    # One metadata key only (as the snapshots): two could be written in either order and hash differently.
    data = safetensors.numpy.save({PREDICTION_TENSOR: values}, metadata={"numdev": json.dumps(meta, sort_keys=True)})
    write_bytes(Path(run_dir) / HELDOUT_PREDICTIONS, data)
    return {"file": HELDOUT_PREDICTIONS, "sha256": hashlib.sha256(data).hexdigest(), "shape": list(values.shape),
            "dtype": "float32", "bytes": len(data)}


def checkpoint_digest_path(checkpoint: str | Path) -> Path:
    """The checksum file beside a checkpoint file (numdev.train.checkpoint_io)."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + CHECKPOINT_DIGEST_SUFFIX)


def read_shadow_csv(path: str | Path) -> list[dict]:
    return tables.read_csv(path, SHADOW_COLUMNS, optional=SHADOW_ADDED)


# token_rows.json: {"format": 1, "tensor": <parameter name>, "rows": <vocabulary size>,
#   "source": "declared" (every caption's tokens, known at the start) | "seen" (tokens of the
#   batches trained so far), "describe": <where the captions came from>,
#   "ids": [token id, ...], "first_step": [the first snapshot step whose weights that row trained in, ...]}
TOKEN_ROWS_FORMAT = 1


def token_rows_problem(record) -> str | None:
    if not isinstance(record, dict) or record.get("format") != TOKEN_ROWS_FORMAT:
        return f"not a format-{TOKEN_ROWS_FORMAT} token-rows record"
    if not isinstance(record.get("tensor"), str) or not _is_int(record.get("rows")) or record["rows"] <= 0:
        return "'tensor' must be a parameter name and 'rows' a positive integer"
    if record.get("source") not in ("declared", "seen"):
        return "'source' must be declared or seen"
    ids, first = record.get("ids"), record.get("first_step")
    if not isinstance(ids, list) or not isinstance(first, list) or len(ids) != len(first):
        return "'ids' and 'first_step' must be lists of one length"
    if not all(_is_int(i) and 0 <= i < record["rows"] for i in ids) or len(set(ids)) != len(ids):
        return f"'ids' must be distinct integers in [0, {record['rows']})"
    if not all(_is_int(s) and s >= 0 for s in first):
        return "'first_step' must hold non-negative integers"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def indexed_rows(records: list[dict | None], step: int) -> dict[str, np.ndarray] | None:
    """{embedding parameter: row ids indexed by `step`} from the token-rows records of the runs being
    compared (the union: a row either run trained is a trained row); None when any run lacks one."""
    if not records or any(r is None for r in records):
        return None
    if len({(r["tensor"], r["rows"]) for r in records}) != 1:
        raise ValueError("the runs' token-rows records name different embeddings: they are different models")
    rows = set()
    for record in records:
        rows.update(i for i, first in zip(record["ids"], record["first_step"]) if first <= step)
    return {records[0]["tensor"]: np.array(sorted(rows), dtype=np.int64)}


def rows_digest(rows: dict[str, np.ndarray] | None) -> dict[str, str]:
    """{embedding parameter: sha256 of its indexed row ids (int64)}: which split a set of
    `<name>` / `<name>[unindexed]` values was made with ({} when no tensor is split)."""
    return {name: hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest() for name, ids in sorted((rows or {}).items())}


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 when it does not exist; links not followed): what a run, a study
    or a command left on disk."""
    path = Path(path)
    if not path.exists():
        return 0
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
