"""Schemas of the files numdev reads back, and the one reader that checks them.

Every file in a run directory is input that may have been truncated, edited or forged. A reader
gets a dict whose required fields are there with the right types, or a ValueError of one line
naming the file and the field. To describe a new file, add a `FileSchema` here and read it with
`read_json_file` / `read_yaml_file`; to add a field to an existing one, add it to `optional`
(older files lack it) or `required`.

A field's type may be a type, a tuple of types, FINITE (a number that is not NaN or infinite), or
another FileSchema (a mapping checked by it, its messages naming the field's dotted path);
`each` checks every value of a mapping field (role -> entry); `choices` names the values a field may
take (a run's status). `finite=True` refuses NaN and
infinities anywhere in the file. Every message is one line naming the file and the field.

Readers for each file numdev reads back are at the end (read_saved_config,
read_study_config, read_outcome, read_figure_summary, read_study_summary, read_bench_records):
the analysis tools call these, not json/yaml directly.
"""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from numdev.runs.atomic import RECORD_LIMIT

NUMBER = (int, float)


class _Finite:
    """A field type: a number (int or float) that is neither NaN nor infinite."""

    __name__ = "finite number"


FINITE = _Finite()
_NAMES = {str: "a string", int: "an integer", float: "a number", dict: "a mapping", list: "a list", bool: "true/false",
          type(None): "null"}


@dataclass(frozen=True)
class FileSchema:
    what: str  # what the file is, for messages: "run record"
    required: dict = field(default_factory=dict)  # field -> type or tuple of types
    optional: dict = field(default_factory=dict)  # checked when present (null allowed)
    items: dict | None = None  # for a field "entries"-like list: schema of each item, keyed by list field name
    each: dict | None = None  # for a mapping field: the type or schema of each of its values
    rest: object = None  # the type or schema of every field not named in required or optional
    finite: bool = False  # no NaN or infinity anywhere in the file
    choices: dict | None = None  # field -> the values it may take (checked when present)

    def check(self, path: str | os.PathLike, data, prefix: str = "", outer: str | None = None) -> dict:
        """`data` if it matches; prefix and outer: the dotted path and the file's `what` of a nested mapping."""
        what = outer or self.what
        if not isinstance(data, dict):
            where = f"field '{prefix.rstrip('.')}' " if prefix else ""
            raise ValueError(f"{path}: {where}holds {_kind(data)}, not a mapping: the {what} is corrupt or was edited")
        if self.finite:
            _check_finite(path, data, prefix, what)
        for name, types in self.required.items():
            if name not in data:
                raise ValueError(f"{path}: field '{prefix}{name}' is missing: the {what} is incomplete or was edited")
            _check_type(path, prefix + name, data[name], types, what)
        for name, types in self.optional.items():
            if data.get(name) is not None:
                _check_type(path, prefix + name, data[name], types, what)
        for name, allowed in (self.choices or {}).items():
            if name in data and data[name] not in allowed:
                raise ValueError(f"{path}: field '{prefix}{name}' is {data[name]!r}, not one of {', '.join(map(repr, allowed))}: "
                                 f"the {what} is corrupt or was edited")
        for name, schema in (self.items or {}).items():
            entries = data.get(name) or []
            if not isinstance(entries, list):
                _check_type(path, prefix + name, entries, list, what)
            for i, item in enumerate(entries):
                if prefix:
                    schema.check(path, item, f"{prefix}{name}[{i}].", what)
                else:
                    schema.check(f"{path}: {name}[{i}]", item)
        if self.rest is not None:
            for name, value in data.items():
                if name not in self.required and name not in self.optional:
                    _check_type(path, prefix + name, value, self.rest, what)
        for name, types in (self.each or {}).items():
            values = data.get(name)
            if isinstance(values, dict):
                for key, value in values.items():
                    _check_type(path, f"{prefix}{name}.{key}", value, types, what)
        return data


def _check_type(path, name: str, value, types, what: str) -> None:
    if isinstance(types, FileSchema):
        types.check(path, value, f"{name}.", what)
        return
    types = types if isinstance(types, tuple) else (types,)
    for kind in types:
        if isinstance(kind, FileSchema):
            if isinstance(value, dict):
                kind.check(path, value, f"{name}.", what)
                return
        elif kind is FINITE:
            if isinstance(value, NUMBER) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise ValueError(f"{path}: field '{name}' is {value}, not a finite number: the {what} is corrupt or was edited")
                return
        elif isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
            return
    wanted = " or ".join("a mapping" if isinstance(t, FileSchema) else "a finite number" if t is FINITE else _NAMES.get(t, t.__name__)
                         for t in types)
    raise ValueError(f"{path}: field '{name}' is {_kind(value)}, not {wanted}: the {what} is corrupt or was edited")


def _check_finite(path, data, prefix: str, what: str) -> None:
    """Refuse NaN and infinities anywhere below `data`, naming the first one's dotted path."""
    stack = [(prefix.rstrip("."), data)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path}: field '{name}' is {value}, not a finite number: the {what} is corrupt or was edited")
        if isinstance(value, dict):
            stack.extend((f"{name}.{k}" if name else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(value))


def _kind(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return f"a string ({value[:30]!r})"
    return {dict: "a mapping", list: "a list", bool: "a boolean", type(None): "null", int: "an integer", float: "a number"}.get(
        type(value), f"a {type(value).__name__}"
    )


MAX_RECORD_BYTES = RECORD_LIMIT  # numdev's JSON and YAML records are kB; a larger one is not read into memory


def _check_record_size(path: Path, what: str) -> None:
    size = path.stat().st_size
    if size > MAX_RECORD_BYTES:
        raise ValueError(f"{path}: {size} bytes, far more than a {what} holds (at most {MAX_RECORD_BYTES >> 20} MiB): "
                         "the file is corrupt or not numdev's; restore it from a copy (nothing was read)")


def read_json_file(path: str | os.PathLike, schema: FileSchema) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is a directory, not a file" if path.is_dir() else f"{path} does not exist")
    _check_record_size(path, schema.what)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        reason = (f"{error.msg} at line {error.lineno}" if isinstance(error, json.JSONDecodeError)
                  else "nested too deeply" if isinstance(error, RecursionError) else "not UTF-8")
        raise ValueError(f"{path}: not valid JSON ({reason}): the {schema.what} is corrupt or truncated") from None
    except OSError as error:
        raise ValueError(f"{path}: could not be read ({error.strerror or error})") from None
    return schema.check(path, data)


def read_yaml_file(path: str | os.PathLike, schema: FileSchema) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is a directory, not a file" if path.is_dir() else f"{path} does not exist")
    _check_record_size(path, schema.what)
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as error:
        reason = "not UTF-8" if isinstance(error, UnicodeDecodeError) else type(error).__name__
        raise ValueError(f"{path}: not valid YAML ({reason}): the {schema.what} is corrupt or truncated") from None
    except OSError as error:
        raise ValueError(f"{path}: could not be read ({error.strerror or error})") from None
    return schema.check(path, data)


# -- the files --------------------------------------------------------------------------------------
PROVENANCE = FileSchema(  # the block numdev.runs.provenance.provenance() writes into run.json and every result
    "provenance block",
    optional={"date": str, "seeds": list,
              "machine": FileSchema("provenance block", optional={
                  "cpu": str, "cpu_flags": list, "logical_cpus": int, "torch_threads": int, "torch_cpu_capability": str,
                  "gpu": str, "platform": str, "gpu_capability": str, "gpu_driver": str}),
              "versions": FileSchema("provenance block", rest=(str, int, type(None))),  # numdev, torch, cuda, cudnn, triton, ...
              "git": FileSchema("provenance block", optional={"commit": str, "dirty": bool})},
)
RUN_STATUSES = ("running", "finished", "stopped", "failed")  # numdev.runs.record, numdev.train.run
RUN = FileSchema(  # <run_dir>/run.json (numdev.runs.record)
    "run record",
    required={"status": str},
    optional={"app": str, "started": str, "finished": str, "final_step": int, "max_steps": int, "resumes": list,
              "eval": dict, "final_loss": NUMBER, "snapshot_write_seconds": dict, "data": dict, "error": str, "seeds": dict,
              "step_seconds": dict, "optimization": dict, "backend": str, "attention": dict, "attention_tiling": dict,
              "device": str, "provenance": PROVENANCE, "precision": str, "precision_gemm": dict, "model": str, "name": str,
              "threads": int, "world_size": int, "global_rank": int, "torch": str, "lightning": str, "numdev_version": str},
    choices={"status": RUN_STATUSES},
)
RESUME = FileSchema("resume entry", required={"from_step": int})
RUN_RESUMES = FileSchema(RUN.what, RUN.required, RUN.optional, items={"resumes": RESUME}, choices=RUN.choices)
CONFIG = FileSchema(  # <run_dir>/config.yaml (the resolved config); the sections that readers compare between runs typed
    "saved config",
    required={"model": dict, "trainer": FileSchema("saved config", optional={"max_steps": int}), "seed": dict},
    optional={"data": dict, "precision": (dict, str), "optimization": dict, "attention": dict,
              "optim": FileSchema("saved config", optional={"warmup_steps": int, "optimizer": dict})},
)
INSTABILITY_EVENT = FileSchema("instability event", required={"step": int, "kind": str})
INSTABILITY = FileSchema(  # <run_dir>/instability.json (numdev.train.callbacks.instability)
    "instability record", required={"events": list}, optional={"format": int, "settings": dict},
    items={"events": INSTABILITY_EVENT},
)
SNAPSHOT_ENTRY = FileSchema("snapshot index entry", required={"step": int, "file": str, "sha256": str},
                            optional={"stored": str, "base_step": int})
SNAPSHOT_INDEX = FileSchema(  # <run_dir>/weights/index.json (numdev.weights.store)
    "snapshot index", required={"format": int, "model": str, "param_shapes": dict, "snapshots": list},
    items={"snapshots": SNAPSHOT_ENTRY},
)
MULTIRUN = FileSchema("Hydra multirun.yaml", required={"hydra": dict})  # <sweep>/multirun.yaml
VERDICT = FileSchema("verdict", required={"status": str, "rule": str}, optional={"detail": str})
FIGURE_SUMMARY = FileSchema(  # <sweep>/<figure>.json (numdev.bench.figure), what the report reads
    "figure summary", required={"figure": str},
    optional={"caption": str, "verdict": str, "verdict_rule": str, "claim_holds": bool, "status": str, "table": str,
              "provenance": PROVENANCE, "jobs": int, "sweep": str, "parts": dict, "deciding_rows": list},
)
ESTIMATE = FileSchema("estimate", required={"value": (FINITE, type(None)), "n": int},
                      optional={"low": FINITE, "high": FINITE})
PAIR_METRIC = FileSchema("distance curve", optional={"slope": ESTIMATE, "final": ESTIMATE})
RATIO = FileSchema("ratio", required={"estimate": ESTIMATE, "verdict": VERDICT})
DOWNSTREAM_ROLE = FileSchema("downstream entry", required={"mean": ESTIMATE}, optional={"difference_to_reference": ESTIMATE})
DOWNSTREAM = FileSchema("downstream outcome", required={"label": str, "roles": dict},
                        optional={"seed_spread": FINITE}, each={"roles": DOWNSTREAM_ROLE})
SAMPLES = FileSchema("samples entry", required={"path": str, "replicate": int, "scores": dict})
STUDY_VERDICTS = FileSchema(  # the summary's verdicts: the metric they judge and one verdict per claim
    "study verdicts", required={"metric": str, "fig7": VERDICT, "fig8": VERDICT}, rest=VERDICT)
STUDY_SUMMARY = FileSchema(  # <study>/summary.json (numdev.analysis.study), what the report reads
    "study summary",
    required={"primary_metric": str, "paper_metric": str, "pairs": dict, "ratios": dict, "verdicts": STUDY_VERDICTS,
              "role_order": list, "replicates": list, "steps": int, "captions": dict, "under_test": str,
              "under_test_backend": str, "reference_backend": str, "precision": str, "model": str, "roles": dict,
              "growth_measure": str},
    optional={"downstream": dict, "samples": dict, "provenance": PROVENANCE, "shadow": dict,
              "early": dict, "calibration": dict, "headline": dict, "paper_roles": dict, "missing": list,
              "rejudged": dict},  # verdicts made again from the summary's numbers (numdev.analysis.study.rejudge)
    each={"pairs": dict, "ratios": dict, "captions": str, "downstream": DOWNSTREAM, "samples": SAMPLES},
    finite=True,
)
STUDY_BLOCK = FileSchema("study block", required={"role": str}, optional={"replicate": int, "kind": str, "label": str})
STUDY_CONFIG = FileSchema(  # <study>/r<k>/<role>/config.yaml: a role's saved config (CONFIG), with its study block
    CONFIG.what, CONFIG.required, {**CONFIG.optional, "study": STUDY_BLOCK},
)
OUTCOME = FileSchema(  # <run_dir>/eval.json (sample scores) and heldout.json (held-out loss)
    "outcome record", optional={"heldout_loss": FINITE, "unigram_entropy": FINITE, "colour_accuracy": FINITE, "shape_accuracy": FINITE,
                                "position_accuracy": FINITE, "scored": int, "step": int},
)
HELDOUT_PREDICTIONS = FileSchema(  # heldout.json's "predictions": the file beside it and its checksum
    "held-out record", required={"file": str, "sha256": str, "shape": list, "dtype": str, "bytes": int})
HELDOUT_RECORD = FileSchema(  # <run_dir>/heldout.json (numdev.train.callbacks.heldout), as the function-level comparisons read it
    "held-out record", required={"step": int, "heldout_loss": FINITE, "images": int, "seed": int},
    optional={"inputs_sha256": str, "predictions": HELDOUT_PREDICTIONS, "perplexity": FINITE, "tokens": int,
              "item_losses": list, "unigram_entropy": FINITE},
)
SAMPLE_ENTRY = FileSchema(  # one entry of eval.json's "samples" (numdev.train.evaluation.score_shapes)
    "sample scores", required={"caption": str}, optional={"colour": str, "shape": str, "position": str})
SAMPLE_SCORES = FileSchema(  # <run_dir>/eval.json with its per-sample classes (numdev.train.callbacks.samples)
    "sample scores", required={"step": int, "sample_seed": int, "scored": int, "samples": list},
    optional={"colour_accuracy": FINITE, "shape_accuracy": FINITE, "position_accuracy": FINITE, "sampler": (str, dict)},
)
CONTINUATION_ENTRY = FileSchema("continuation", required={"prompt": str, "continuation": str})
CONTINUATIONS = FileSchema(  # <run_dir>/continuations.json (numdev.train.callbacks.continuations)
    "continuations", required={"step": int, "decoding": str, "length": int, "samples": list}, optional={"seconds": FINITE})
BENCH_RECORD = FileSchema(  # one line of <job>/results.jsonl (numdev.bench.app)
    "bench record", required={"kind": str, "method": str},
    optional={"seed": int, "experiment": str, "shape": dict, "metrics": dict, "provenance": PROVENANCE, "overrides": list,
              "seconds": FINITE},
)


# -- the readers ------------------------------------------------------------------------------------
def read_saved_config(path: str | os.PathLike) -> dict:
    """A run's config.yaml."""
    return read_yaml_file(path, CONFIG)


def read_study_config(path: str | os.PathLike) -> dict:
    """A study role's config.yaml: its `study` block, when present, a mapping with a string role
    (and an integer replicate, string kind and label)."""
    return read_yaml_file(path, STUDY_CONFIG)


def read_outcome(path: str | os.PathLike, key: str) -> float | None:
    """The number `key` of eval.json / heldout.json (None: the run has no such file or value)."""
    path = Path(path)
    if not path.is_file():
        return None
    value = read_json_file(path, OUTCOME).get(key)
    if value is not None:
        _check_type(path, key, value, FINITE, OUTCOME.what)
        if key.endswith("_accuracy") and not 0 <= value <= 1:
            raise ValueError(f"{path}: {key} = {value!r} is not a share in [0, 1]: the record was edited or forged")
        if key == "heldout_loss" and value < 0:
            raise ValueError(f"{path}: {key} = {value!r} is negative, which a loss (a mean squared error or a cross-entropy) cannot be: the record was edited or forged")
    return value


@contextmanager
def result_fields(path: str | os.PathLike, what: str):
    """Reading the fields of a result with no FileSchema here (a script's own JSON under docs/results,
    rendered into a doc block): a field missing or of the wrong type - a forged, edited or older
    file - is one ValueError naming the file, not a KeyError's traceback. Render the whole block
    inside it, before anything is written. The message names the line that read the field, so that a
    reader's own bug (a file its script just wrote, refused) is not taken for the file's fault."""
    import traceback

    try:
        yield
    except (KeyError, TypeError, IndexError, AttributeError) as error:
        field = f"no field {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        frame = traceback.extract_tb(error.__traceback__)[-1]
        site = Path(frame.filename).resolve()
        checkout = Path(__file__).resolve().parents[3]  # src/numdev/runs/schemas.py
        shown = site.relative_to(checkout) if site.is_relative_to(checkout) else site.name
        raise ValueError(f"{path}: not a {what} as its script writes it ({field}, read at {shown}:{frame.lineno}): rerun "
                         "the command that wrote it; if it has just written it, that line is at fault: report it") from None


def read_figure_summary(path: str | os.PathLike) -> dict:
    return read_json_file(path, FIGURE_SUMMARY)


def read_study_summary(path: str | os.PathLike) -> dict:
    return read_json_file(path, STUDY_SUMMARY)
