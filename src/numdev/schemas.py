"""Schemas of the files numdev reads back, and the one reader that checks them.

Every file in a run directory is input that may have been truncated, edited or forged. A reader
gets a dict whose required fields are there with the right types, or a ValueError of one line
naming the file and the field. To describe a new file, add a `FileSchema` here and read it with
`read_json_file` / `read_yaml_file`; to add a field to an existing one, add it to `optional`
(older files lack it) or `required`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

NUMBER = (int, float)
_NAMES = {str: "a string", int: "an integer", float: "a number", dict: "a mapping", list: "a list", bool: "true/false"}


@dataclass(frozen=True)
class FileSchema:
    what: str  # what the file is, for messages: "run record"
    required: dict = field(default_factory=dict)  # field -> type or tuple of types
    optional: dict = field(default_factory=dict)  # checked when present (null allowed)
    items: dict | None = None  # for a field "entries"-like list: schema of each item, keyed by list field name

    def check(self, path: str | os.PathLike, data) -> dict:
        if not isinstance(data, dict):
            raise ValueError(f"{path}: holds {_kind(data)}, not a mapping: the {self.what} is corrupt or was edited")
        for name, types in self.required.items():
            if name not in data:
                raise ValueError(f"{path}: field '{name}' is missing: the {self.what} is incomplete or was edited")
            _check_type(path, name, data[name], types, self.what)
        for name, types in self.optional.items():
            if data.get(name) is not None:
                _check_type(path, name, data[name], types, self.what)
        for name, schema in (self.items or {}).items():
            for i, item in enumerate(data.get(name) or []):
                schema.check(f"{path}: {name}[{i}]", item)
        return data


def _check_type(path, name: str, value, types, what: str) -> None:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        wanted = " or ".join(_NAMES.get(t, t.__name__) for t in types)
        raise ValueError(f"{path}: field '{name}' is {_kind(value)}, not {wanted}: the {what} is corrupt or was edited")


def _kind(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def read_json_file(path: str | os.PathLike, schema: FileSchema) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = f"{error.msg} at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else "not UTF-8"
        raise ValueError(f"{path}: not valid JSON ({reason}): the {schema.what} is corrupt or truncated") from None
    return schema.check(path, data)


def read_yaml_file(path: str | os.PathLike, schema: FileSchema) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid YAML ({type(error).__name__}): the {schema.what} is corrupt or truncated") from None
    return schema.check(path, data)


# -- the files --------------------------------------------------------------------------------------
RUN = FileSchema(  # <run_dir>/run.json (numdev.train.record)
    "run record",
    required={"status": str},
    optional={"app": str, "started": str, "finished": str, "final_step": int, "max_steps": int, "resumes": list,
              "eval": dict, "final_loss": NUMBER, "snapshot_write_seconds": dict, "error": str, "seeds": dict},
)
RESUME = FileSchema("resume entry", required={"from_step": int})
RUN_RESUMES = FileSchema(RUN.what, RUN.required, RUN.optional, items={"resumes": RESUME})
CONFIG = FileSchema(  # <run_dir>/config.yaml (the resolved config)
    "saved config", required={"model": dict, "trainer": dict, "seed": dict}
)
INSTABILITY_EVENT = FileSchema("instability event", required={"step": int, "kind": str})
INSTABILITY = FileSchema(  # <run_dir>/instability.json (numdev.train.instability)
    "instability record", required={"events": list}, optional={"format": int, "settings": dict},
    items={"events": INSTABILITY_EVENT},
)
SNAPSHOT_ENTRY = FileSchema("snapshot index entry", required={"step": int, "file": str, "sha256": str},
                            optional={"stored": str, "base_step": int})
SNAPSHOT_INDEX = FileSchema(  # <run_dir>/weights/index.json (numdev.snapshot_store)
    "snapshot index", required={"format": int, "model": str, "param_shapes": dict, "snapshots": list},
    items={"snapshots": SNAPSHOT_ENTRY},
)
MULTIRUN = FileSchema("Hydra multirun.yaml", required={"hydra": dict})  # <sweep>/multirun.yaml
FIGURE_SUMMARY = FileSchema("figure summary", required={"figure": str})  # <sweep>/<figure>.json
STUDY_SUMMARY = FileSchema(  # <study>/summary.json (numdev.analysis.study), what the report reads
    "study summary",
    required={"primary_metric": str, "paper_metric": str, "pairs": dict, "ratios": dict, "verdicts": dict,
              "role_order": list, "replicates": list, "steps": int, "captions": dict, "under_test": str},
    optional={"downstream": dict, "samples": dict, "provenance": dict, "shadow": dict,
              "early": dict, "calibration": dict, "headline": dict, "paper_roles": dict},
)
