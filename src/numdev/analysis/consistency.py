"""A study's runs checked against each other before anything is computed from them.

Sibling runs are comparable only if they trained the same workload: a role directory copied in
from another study (another learning rate, resolution or step count), a rung whose label was edited
away from what it ran, or a margin changed after the runs were launched would silently change every
number. Each check fails with one line naming the run directories that disagree (WORKLOAD_KEYS):

- every run has the same value of each WORKLOAD_KEYS key as the reference of replicate 0 (the
  learning rate too, except for roles of kind positive_control, whose role file may change it);
- every run's `study.harm` block (the pre-registered outcome and margin) is the same;
- each run sits in `r<study.replicate>/<study.role>`;
- a ladder rung's `study.ladder.size` is the size it ran with (`attention.delta` for the attention-noise
  ladder, `init_perturbation.eps` for the init ladder);
- runs of the same precision computed their bf16/fp16 products the same way (run.json
  `precision_gemm.route`: numdev.train.precision).

One home for both analyses: the flash-stability study's (numdev.analysis.study, its early phase and
the optimizations catalogue) and the harm study's (numdev.analysis.harm) call `check` on the runs
numdev.analysis.study_runs.discover found. The sibling CSVs they read are checked by their reader
(numdev.weights.metrics.read_distances_csv: no (step, tensor) row twice, no negative distance).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from numdev.config.objective import objective_of

WORKLOAD_KEYS = ("name", "model", "objective", "data.resolution", "data.sequence_length", "data.corpus", "data.batch_size", "trainer.max_steps", "snapshot.every_n_steps",
                 "snapshot.schedule", "optim.warmup_steps", "optim.cooldown_steps", "diffusion")
LEARNING_RATE = "optim.optimizer.lr"


def config_value(config: dict, key: str):
    """config[key] for a dotted key of a plain (YAML-read) config; None where any part is missing (the objective of
    a config saved before the `objective` group: the diffusion objective it trained, numdev.config.objective)."""
    if key == "objective":
        return objective_of(config)
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _plain(value):
    return OmegaConf.to_container(value, resolve=False) if OmegaConf.is_config(value) else value


def _same(a, b) -> bool:
    """Equal, where a key one mapping lacks and the other holds as null counts as equal (a setting a later numdev
    added with a null default, e.g. study.harm.learned_below, is what an older run ran with)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same(a.get(k), b.get(k)) for k in set(a) | set(b))
    return a == b


def _first_difference(key: str, value, expected) -> tuple[str, object, object]:
    """The first dotted key under `key` where two values differ, with both sides (whole values when not both mappings)."""
    if isinstance(value, dict) and isinstance(expected, dict):
        for part in sorted(set(value) | set(expected), key=str):
            if not _same(value.get(part), expected.get(part)):
                return _first_difference(f"{key}.{part}", value.get(part), expected.get(part))
    return key, value, expected


def check(runs: dict) -> None:
    """Raise ValueError (one line) at the first disagreement between the study's runs."""
    flat = [run for by_rep in runs.values() for run in by_rep.values()]
    reference = next((run for run in flat if run["kind"] == "reference"), flat[0])
    base = reference["config"]
    for key in (*WORKLOAD_KEYS, LEARNING_RATE, "study.harm"):
        expected = _plain(config_value(base, key))
        for run in flat:
            if key == LEARNING_RATE and run["kind"] == "positive_control":
                continue
            value = _plain(config_value(run["config"], key))
            if not _same(value, expected):
                where, value, expected_here = _first_difference(key, value, expected)
                raise ValueError(f"{run['dir']}: {where} = {value!r}, but {reference['dir']} has {expected_here!r}: "
                                 "its runs must train the same workload (a run copied in from another study?)")
    for role, by_rep in runs.items():  # a role's pre-registered claim is one claim, in every replicate
        stated = {r: (run["kind"], run.get("claim"), run.get("claim_than")) for r, run in by_rep.items()}
        first = next(iter(stated))
        for r, value in stated.items():
            if value != stated[first]:
                raise ValueError(f"{by_rep[r]['dir']}: role {role} states kind, claim, claim_than = {value}, but its replicate "
                                 f"{first} states {stated[first]}: a claim is fixed before the study runs (an edited config.yaml?)")
    for run in flat:
        where = (run["dir"].parent.name, run["dir"].name)
        if where != (f"r{run['replicate']}", run["role"]):
            raise ValueError(f"{run['dir']}: its config says role {run['role']!r}, replicate {run['replicate']}, "
                             f"but it sits in {where[0]}/{where[1]}: move it back or re-run it")
        ladder = run.get("ladder") or {}
        if ladder.get("name") in ("attention_noise", "init") and ladder.get("size") != "ulp":
            key = "attention.delta" if ladder["name"] == "attention_noise" else "init_perturbation.eps"
            ran = config_value(run["config"], key)
            if ran is None or abs(float(ran) - float(ladder["size"])) > 1e-12 * abs(float(ladder["size"])):
                raise ValueError(f"{run['dir']}: study.ladder.size = {ladder['size']!r} but it ran with {key} = {ran!r}: "
                                 "a rung must say the size it ran with")
    routes: dict[str, tuple] = {}
    for run in flat:
        precision = config_value(run["config"], "precision.name")
        route = (run["record"].get("precision_gemm") or {}).get("route")
        if precision in routes and route != routes[precision][0]:
            raise ValueError(f"{run['dir']}: its {precision} products ran by the {route!r} route but {routes[precision][1]}'s by "
                             f"{routes[precision][0]!r} (precision.gemm): run the whole study on one machine with one setting")
        routes.setdefault(precision, (route, run["dir"]))
