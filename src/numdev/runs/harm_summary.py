"""The harm study's summary.json as a typed, versioned record (experiment=harm, numdev.analysis.harm).

The analysis writes it; the figures (numdev.figures.harm), the report and scripts/harm_table.py read it
through `read_harm_summary`, which checks the schema name, the version and every field's type and
refuses a file that fails (naming the file and the field): a summary edited, truncated or written
by another numdev is never half-read.

Field by field:
- `workload`: model, resolution, steps, precision, learning rate, the attention tiling of each role;
- `margin`: the pre-registered outcome, margin and its sense (`relative`: a fraction of the reference's);
- `roles`: one RoleSummary per role (its claim, outcomes per replicate, effects, function-level
  measures, calibration over steps, margin to harm, the verdict on its claim);
- `calibration`: the ladders' rungs, steps, rules and the replicates whose ladder is non-monotone;
- `harm`: delta_harm (numdev.analysis.harm.threshold);
- `headline`: the sentence, shown only when every pre-registered claim holds, else why not;
- `table`: the headline table's rows (every measure side by side, judged against the paper's 2-5x).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

SCHEMA = "numdev.harm_summary"
VERSION = 2
READS = (1, 2)  # version 1 lacks RoleSummary.margin_per_call (read as None)
PRIMARY_OUTCOME = "heldout_loss"  # what "harms" is judged on (study.harm.outcome; numdev.analysis.harm.effects)
HARMS, NO_HARM, MORE_HARM = "harms", "no_harm", "more_harm_than"
CLAIMS = (HARMS, NO_HARM, MORE_HARM)  # a role file's study.claim (study.claim_than names the other role of more_harm_than)


@dataclass
class RoleSummary:
    role: str
    kind: str
    label: str
    replicates: list[int]
    claim: str | None = None
    claim_than: str | None = None
    tiling: list[dict] | None = None
    gemm_route: str | None = None
    outcomes: dict = field(default_factory=dict)  # outcome -> {replicate: value}
    effects: dict = field(default_factory=dict)  # outcome -> effect against the reference (and against independent seeds)
    function_level: dict = field(default_factory=dict)  # churn, prediction disagreement, loss barrier
    calibration: dict = field(default_factory=dict)  # ladder -> {steps, stability, value}
    margin_to_harm: dict | None = None
    control: dict | None = None  # the verdict on its pre-registered claim
    per_call: dict | None = None  # the shadow's per-call deviation (relative RMS, signed bias)
    margin_per_call: dict | None = None  # delta_harm / that relative RMS (numdev.analysis.harm.threshold.PER_CALL_RULE; version 2)


@dataclass
class HarmSummary:
    study_dir: str
    command: str
    provenance: dict
    workload: dict
    margin: dict
    replicates: list[int]
    roles: dict[str, RoleSummary]
    calibration: dict
    harm: dict
    headline: dict
    table: list[dict]
    rules: dict
    problems: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    version: int = VERSION

    def to_json(self) -> dict:
        return asdict(self)

    def role(self, name: str) -> RoleSummary | None:
        return self.roles.get(name)


_TYPES = {"str": str, "int": int, "dict": dict, "list": list}


def _check(cls, data, where: str) -> dict:
    """`data`'s fields for dataclass `cls`: each present when required and of its declared type."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: holds a {type(data).__name__}, not a mapping")
    out = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"{where}: field {f.name!r} is missing")
            continue
        value = data[f.name]
        declared = str(f.type)
        if value is None and "None" in declared:
            out[f.name] = None
            continue
        kind = declared.split(" | ")[0].split("[")[0]
        expected = _TYPES.get(kind)
        if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            raise ValueError(f"{where}: field {f.name!r} is a {type(value).__name__}, not a {kind}")
        if kind == "list" and "int" in declared and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{where}: field {f.name!r} must be a list of integers")
        out[f.name] = value
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    return out


NUMBERS = ("low", "high", "value", "mean", "sd", "se", "margin", "estimate_value")  # a number (or null) wherever these keys occur
NUMBER_MAPS = ("per_replicate", "counts")  # a mapping of numbers (or nulls) wherever these keys occur
TEXTS = ("text",)
SIGN_COUNTS = ("above", "inside", "below")  # every "counts" is the sign test's (numdev.stats.equivalence)


def _is_number(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check_deep(value, where: str) -> None:
    """The numbers the readers format and compare, wherever they sit in a role (estimates' low/high/value, per-replicate
    values, the sign test's counts, texts): of their type, so an edited summary is refused in one line, not half-rendered."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_deep(item, f"{where}[{index}]")
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        at = f"{where}.{key}"
        if key in NUMBERS and not isinstance(item, dict) and not _is_number(item):
            raise ValueError(f"{at} is {item!r}, not a number")
        if key in NUMBER_MAPS and (not isinstance(item, dict) or not all(_is_number(v) for v in item.values())):
            raise ValueError(f"{at} must map to numbers, not {item!r}"[:300])
        if key == "counts" and not set(SIGN_COUNTS) <= set(item):
            raise ValueError(f"{at} lacks {', '.join(sorted(set(SIGN_COUNTS) - set(item)))}: the sign test's counts are "
                             f"{', '.join(SIGN_COUNTS)}")
        if key in TEXTS and not isinstance(item, str):
            raise ValueError(f"{at} is a {type(item).__name__}, not a text")
        _check_deep(item, at)


def from_json(data, where: str = "summary.json") -> HarmSummary:
    """A HarmSummary from parsed JSON, every field checked (ValueError naming `where` and the field)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: holds a {type(data).__name__}, not a mapping")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not a harm study summary (schema {data.get('schema')!r}, expected {SCHEMA!r})")
    if data.get("version") not in READS or isinstance(data.get("version"), bool):
        raise ValueError(f"{where}: version {data.get('version')!r}; this numdev reads versions "
                         f"{', '.join(map(str, READS))}: re-run numdev-study on the study")
    top = _check(HarmSummary, data, where)
    roles = {}
    for name, block in top["roles"].items():
        role = RoleSummary(**_check(RoleSummary, block, f"{where}: roles.{name}"))
        for outcome, values in role.outcomes.items():  # outcome -> {replicate: value}
            if not isinstance(values, dict) or not all(_is_number(v) for v in values.values()):
                raise ValueError(f"{where}: roles.{name}.outcomes.{outcome} must map replicates to numbers, not {values!r}"[:300])
        _check_deep(block, f"{where}: roles.{name}")
        if role.role != name:
            raise ValueError(f"{where}: roles.{name} says it is role {role.role!r}")
        roles[name] = role
    top["roles"] = roles
    for name in ("harm", "headline", "table", "calibration"):
        _check_deep(top[name], f"{where}: {name}")
    return HarmSummary(**top)


def read_harm_summary(path: str | Path) -> HarmSummary:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error}): re-run numdev-study on the study") from None
    return from_json(data, str(path))


def is_harm_summary(data) -> bool:
    return isinstance(data, dict) and data.get("schema") == SCHEMA
