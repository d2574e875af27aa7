"""Checking a command's configs before Hydra creates a directory or runs a job.

Hydra creates the run (or sweep) directory before numdev sees the config, and a sweep's jobs are
composed one by one as they start: a bad value in the third job of a sweep was found after the
first two had run, and a refused run left an empty run directory behind. So before Hydra starts,
every job of the command is composed here with Hydra's compose API and checked by the app's own
config check (numdev.bench.runner.check_config, numdev.train.run.check_config):

  - a single run: its config;
  - a sweep (-m): every job of the sweep (the command line's sweeps and the experiment's
    hydra.sweeper.params, as Hydra's basic sweeper combines them); a sweep of more than MAX_JOBS
    jobs checks every value once (each swept key's values with the others at their first value).

It also refuses a key added with `+parent.key=...` that nothing would read: under a node built by
`_target_` a key its constructor does not take, under a plain section any new key (`+shape.seqq=256`
was a TypeError traceback), naming the nearest known keys.

A command whose config cannot be composed is left to Hydra, whose own message says why.
"""

from __future__ import annotations

import copy
import difflib
import functools
import inspect
import itertools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

MAX_JOBS = 24  # beyond: each swept value once, not every combination
MAX_SWEEP_JOBS = 2000  # the sweep's jobs checked against each other (check_sweep) up to this many
NO_RUN = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc",
          "--resolve", "-p", "--package"}


class Composer:
    """Hydra's compose API, each (config, overrides) composed once for one command: the checks below
    (a sweep's jobs against each other, then each job's config, then the keys it adds) ask for the same
    configs several times, and a composition costs ~0.2 s. A composition is kept with its Hydra node
    and handed out as a copy; one that failed raises its error again."""

    def __init__(self) -> None:
        self._composed: dict[tuple, DictConfig | Exception] = {}

    def __call__(self, config_name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
        from hydra import compose

        key = (config_name, tuple(overrides))
        if key not in self._composed:
            try:
                self._composed[key] = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
            except Exception as error:  # noqa: BLE001 - raised again below, to each caller that asks
                self._composed[key] = error
        found = self._composed[key]
        if isinstance(found, Exception):
            raise found
        cfg = copy.deepcopy(found)
        if not return_hydra_config:
            with open_dict(cfg):
                del cfg["hydra"]  # as hydra.compose does
        return cfg


def problem(app: str, args: list[str], check: Callable[[DictConfig], None], compose: Composer | None = None) -> str | None:
    """The first thing wrong with the command's configs, as one line (None: every job is fine).
    `compose`: the command's Composer, shared with sweep_problem."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, InstantiationException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    from numdev.cli.errors import USER_ERRORS, missing_key, one_line
    from numdev.config.groups import command_overrides, config_module, refused

    if NO_RUN & set(args) or GlobalHydra.instance().is_initialized():
        return None
    compose = compose or Composer()
    given = command_overrides(args)
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except HydraException:
        return None  # a syntax error: Hydra's own message
    try:
        with initialize_config_module(config_module=config_module(app), version_base="1.3"):
            order = _set_and_deleted(parsed) or _deletion_order_problem(app, parsed, compose)
            if order:
                return order
            jobs, multirun = _jobs(app, parsed, bool({"-m", "--multirun"} & set(args)), compose)
            if jobs is None:
                return None
            added = _added_key_problem(app, parsed, compose) or _deleted_key_problem(app, parsed, compose)
            if added:
                return added
            configs = _configs(app, jobs, compose)
    except ConfigFileError as error:
        return str(error)
    except HydraException:
        return None  # a composition error (an unknown option or key): Hydra's own message
    except Exception as error:  # noqa: BLE001 - a job's config file that is not YAML: named; anything else is Hydra's to say
        return config_file_problem(error)
    for index, (overrides, cfg) in enumerate(zip(jobs, configs)):
        try:
            try:
                check(cfg)
            except InstantiationException as error:  # a constructor refused a value: its own message
                raise (error.__cause__ if isinstance(error.__cause__, USER_ERRORS) else ValueError(refused(error))) from None
            except (ConfigAttributeError, ConfigKeyError) as error:  # a key the run reads is not there (~key deleted it?)
                raise ValueError(missing_key(f"numdev-{app}", error, given)) from None
        except USER_ERRORS as error:
            error = _deleted_and_read(app, one_line(error), parsed)
            if not multirun:
                return one_line(error)
            swept = [o for o in overrides if o not in given]
            if len(jobs) == 1:
                return f"{one_line(error)}; no job was run"
            return f"sweep job {index} ({' '.join(swept) or 'its overrides as given'}): {one_line(error)}; no job was run"
    return None


def sweep_problem(app: str, args: list[str], check_sweep: Callable[[list], str | None], compose: Composer | None = None) -> str | None:
    """The command's jobs checked against each other by `check_sweep(jobs)` (numdev-train: a sibling
    reference that no job makes), each a SweepJob with the directory it will run in: every job of a
    sweep (up to MAX_SWEEP_JOBS), or a single run as a one-job list. None: nothing wrong, or a
    command this cannot expand (Hydra says why when it runs). `compose`: the command's Composer."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from numdev.config.groups import command_overrides, config_module

    if NO_RUN & set(args) or GlobalHydra.instance().is_initialized():
        return None
    compose = compose or Composer()
    try:
        parsed = OverridesParser.create().parse_overrides(command_overrides(args))
        with initialize_config_module(config_module=config_module(app), version_base="1.3"):
            jobs, multirun = _jobs(app, parsed, bool({"-m", "--multirun"} & set(args)), compose)
            if jobs is None:
                return None
            sweep = _sweep_jobs(app, parsed, compose) if multirun else _single_job(app, parsed, compose, _configs(app, jobs, compose)[0])
    except Exception:  # noqa: BLE001 - problem() has said what it can; Hydra says the rest when it runs
        return None
    return check_sweep(sweep) if sweep else None


def misspelled_key(app: str, overrides: list[str], compose, error: Exception, typed: list[str] | None = None) -> str | None:
    """`trainer.max_step=2`: Hydra says "Could not override ... To append to your config use +trainer.max_step=2",
    which would add a key nothing reads; `~trainer.max_step`: "Could not delete from config ... does not exist";
    a key under a node that is not there (attention.inner.formats.preset where attention.inner has no formats):
    "Key 'formats' is not in struct". Each in several lines. The one line names the deepest node that exists
    and the keys it does have, nearest first."""
    import re

    from numdev.config.groups import nearest

    text = str(error)
    mismatch = re.search(r"Could not delete from config\. The value of '([^']+)' is (.*) and not (.*)\.", text)
    if mismatch:  # ~key=value where the key holds another value
        key, has, given_value = mismatch.groups()
        return (f"~{key}={given_value}: {key} is {has}, not {given_value}, so it was not deleted: write ~{key} to delete it "
                "whatever its value")
    added = re.search(r"Could not append to config\. An item is already at '([^']+)'", text)
    if added:  # +key=value over a key that is there
        key = added.group(1)
        shown = next((o for o in [*(typed or []), *overrides] if o.startswith("+") and o.lstrip("+").split("=", 1)[0] == key),
                     f"+{key}=...")
        return (f"{shown}: {key} is already a setting (the config or an option chosen sets it), and + adds a new one: "
                f"write {shown.lstrip('+')} to change it")
    found = re.search(r"Could not override '([^']+)'", text) or re.search(r"Could not delete from config\. '([^']+)'", text)
    if not found:
        return None
    key, deleting = found.group(1), found.re.pattern.startswith("Could not delete")
    def on_key(line):
        return line.split("=", 1)[0].lstrip("~+") == key
    def of_key(lines):  # the override Hydra refused: a deletion (~key) or a value (key=, +key=)
        return next((o for o in lines if on_key(o) and o.startswith("~") == deleting), None)

    shown = of_key(typed or []) or of_key(overrides)  # as typed (a sweep's whole list)
    try:
        cfg = compose(config_name=app, overrides=[o for o in overrides if not on_key(o)])
    except Exception:  # noqa: BLE001 - another override is wrong too: Hydra's own message
        return None
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):  # the deepest node on the key's path that exists (0: the config itself)
        parent, leaf = ".".join(parts[:depth]), parts[depth]
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is not None:
            break
    if not isinstance(node, DictConfig):
        return None
    if leaf in node:  # the key exists: Hydra refused the value (its own message), or a null it cannot delete
        if deleting and depth == len(parts) - 1 and node[leaf] is None:
            target = node.get("_target_") if parent else None
            if target is not None and constructor_parameter(target, leaf) is None:  # a key its _target_ does not take
                return (f"{shown}: {key} is null (not set), and Hydra deletes no null: to drop it, give it a value first in "
                        f"the same command ({key}=0 ~{key})")
            return (f"{shown}: {key} is null (not set) already, and Hydra deletes no null; numdev-{app} reads it as null "
                    f"(unset), so leave it, or set a value ({key}=...)")
        return None
    owner = parent or f"numdev-{app}"
    keys = sorted(str(k) for k in node.keys())
    value = shown.split("=", 1)[1] if shown and "=" in shown else "..."
    near = nearest(leaf, keys)
    settings = f"its settings are {', '.join(keys[:12])}{' ...' if len(keys) > 12 else ''}"
    def spelled(k):  # the key with the missing part replaced, the rest of its path kept
        return ".".join([*parts[:depth], k, *parts[depth + 1:]])

    if deleting:
        hint = f"did you mean {' or '.join(f'~{spelled(k)}' for k in near)}?" if near else settings
        return f"{shown}: {owner} has no setting {leaf}, so there is nothing to delete: {hint} (numdev-{app} --cfg job shows every key)"
    if not parent:
        from numdev.config.groups import app_defaults, unchosen_group

        if app_defaults(app).get(leaf, "") is None and not (shown or "").startswith("+"):  # study.role=x, no study chosen
            return unchosen_group(app, shown or key, leaf, key)
        return None  # a top-level key: the app's own message names its groups
    hint = f"did you mean {' or '.join(f'{spelled(k)}={value}' for k in near)}?" if near else settings
    return (f"{shown or key}: {parent} has no setting {leaf}: {hint} (numdev-{app} --cfg job shows every key; "
            f"+{key}=... would add a key nothing reads)")


def _jobs(app: str, parsed, multirun: bool, compose, every: bool = False):
    """The override list of every job the command would run (None: a sweep this cannot expand), and
    whether it is a sweep (-m, or hydra.mode=MULTIRUN set by an experiment such as flash_stability).
    With `every`, also the sweep's Hydra config and every job in Hydra's order, however many."""
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = {o.get_key_element(): list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()}
    first = [f"{key}={values[0]}" for key, values in swept.items()]
    try:
        hydra_cfg = compose(config_name=app, overrides=[*plain, *first], return_hydra_config=True).hydra
    except Exception as error:  # noqa: BLE001 - composition errors: Hydra's own message when it runs
        yaml_problem = config_file_problem(error) or misspelled_key(app, [*plain, *first], compose, error,
                                                                  [o.input_line for o in parsed])
        if yaml_problem:  # Hydra's would be a traceback, after the run directory exists
            raise ConfigFileError(yaml_problem) from None
        return None, multirun
    multirun = multirun or str(hydra_cfg.get("mode")) in ("MULTIRUN", "RunMode.MULTIRUN")
    if not multirun:
        return [plain], False
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = hydra_cfg.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params else {}
    from_config = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    given = {o.get_key_element() for o in parsed if not o.is_sweep_override()}
    swept = {**{o.get_key_element(): list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.input_line.split("=", 1)[1]]
                for o in from_config if o.get_key_element() not in given},
             **swept}  # the command line wins, as in Hydra's basic sweeper (a plain value too: study.replicate=0)
    keys = list(swept)
    if every:
        total = 1
        for values in swept.values():
            total *= len(values)
        if total > MAX_SWEEP_JOBS:
            return None, hydra_cfg
        # Hydra's basic sweeper: the product of the swept values, the last key varying fastest
        return [[*plain, *(f"{k}={v}" for k, v in zip(keys, combo))] for combo in itertools.product(*(swept[k] for k in keys))], hydra_cfg
    if not keys:
        return [plain], True
    total = 1
    for values in swept.values():
        total *= len(values)
    if total <= MAX_JOBS:
        combos = itertools.product(*(swept[k] for k in keys))
    else:  # each value once: the other keys at their first value
        combos = [tuple(swept[k][0] for k in keys)]
        for i, key in enumerate(keys):
            for value in swept[key][1:]:
                combos.append(tuple(value if j == i else swept[k][0] for j, k in enumerate(keys)))
    return [[*plain, *(f"{k}={v}" for k, v in zip(keys, combo))] for combo in combos], True


@dataclass
class SweepJob:
    """One job of a sweep as Hydra will run it: its number, its overrides, its config, and the
    directory it will run in (hydra.sweep.dir / hydra.sweep.subdir, resolved for this job; the
    config's run_dir set to it)."""

    num: int
    overrides: list[str]
    cfg: DictConfig
    run_dir: str
    one_at_a_time: bool  # the launcher runs the sweep's jobs one after another (Hydra's basic launcher, or n_jobs=1)
    sweep_dir: str | None  # None: a single run (not a sweep)
    swept: list[str]  # the overrides that make this job differ from the sweep's other jobs


def _sweep_jobs(app: str, parsed, compose) -> list[SweepJob] | None:
    """Every job of the sweep with its run directory, in the order Hydra's basic sweeper lists them
    (None: more than MAX_SWEEP_JOBS, or a directory that cannot be resolved here)."""
    import os

    jobs, hydra_cfg = _jobs(app, parsed, True, compose, every=True)
    if jobs is None or hydra_cfg is None:
        return None
    plain = {o.input_line for o in parsed if not o.is_sweep_override()}
    try:
        sweep_dir = str(hydra_cfg.sweep.dir)
        subdir = OmegaConf.to_container(hydra_cfg.sweep, resolve=False).get("subdir")
        launcher = OmegaConf.to_container(hydra_cfg.launcher, resolve=True)
    except Exception:  # noqa: BLE001 - a directory built from something only Hydra knows when it runs
        return None
    target = str(launcher.get("_target_", ""))
    one_at_a_time = target.endswith("BasicLauncher") or (target.endswith("ParallelLauncher") and launcher.get("n_jobs") == 1)
    out = []
    for num, (overrides, cfg) in enumerate(zip(jobs, _configs(app, jobs, compose))):
        job = cfg.copy()
        try:
            OmegaConf.update(job, "hydra", {"job": {"num": num}, "sweep": {"subdir": subdir}}, merge=True, force_add=True)
            name = str(OmegaConf.select(job, "hydra.sweep.subdir", throw_on_resolution_failure=True))
            run_dir = os.path.normpath(os.path.join(sweep_dir, name))
            OmegaConf.update(job, "run_dir", run_dir, merge=False, force_add=True)
        except Exception:  # noqa: BLE001 - a subdir built from something only Hydra knows when it runs
            return None
        out.append(SweepJob(num, overrides, job, run_dir, one_at_a_time, os.path.normpath(sweep_dir), [o for o in overrides if o not in plain]))
    return out


def _single_job(app: str, parsed, compose, cfg: DictConfig) -> list[SweepJob] | None:
    """A single run as a one-job "sweep" (sweep_dir None), in the directory Hydra will give it."""
    import os

    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    try:
        run_dir = os.path.normpath(str(compose(config_name=app, overrides=plain, return_hydra_config=True).hydra.run.dir))
        job = cfg.copy()
        OmegaConf.update(job, "run_dir", run_dir, merge=False, force_add=True)
    except Exception:  # noqa: BLE001 - a directory built from something only Hydra knows when it runs
        return None
    return [SweepJob(0, plain, job, run_dir, True, None, [])]


class ConfigFileError(ValueError):
    """A config file (a user's option, say) that is not valid YAML: one line naming the file and the place."""


def config_file_problem(error: BaseException) -> str | None:
    """A YAML syntax error anywhere in `error`'s chain, as one line naming the file, line and column."""
    import yaml

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, yaml.YAMLError):
            mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
            where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
            what = " ".join(str(getattr(error, "problem", None) or type(error).__name__).split())
            return f"{where}: not valid YAML ({what}): fix the file (nothing was run)"
        error = error.__cause__ or error.__context__
    return None


def _configs(app: str, jobs: list[list[str]], compose) -> list[DictConfig]:
    """Each job's config. Composing is what costs (~0.2 s each): jobs that differ only in plain values
    (numerics.precision=bf16,fp16; study.replicate=0,1,2) share one composition of their config
    groups and get their values set on a copy, as Hydra's override would set them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from numdev.config.groups import group_dir

    if len(jobs) == 1:  # one job: its own composition, the one the command's other checks already asked for
        return [compose(config_name=app, overrides=jobs[0])]
    parser = OverridesParser.create()
    composed: dict[tuple, DictConfig] = {}
    configs = []
    for overrides in jobs:
        parsed = parser.parse_overrides(overrides)
        plain = [o for o in parsed if not (o.is_add() or o.is_delete() or o.is_force_add() or o.package is not None)
                 and "/" not in o.key_or_group and not ("." not in o.key_or_group and group_dir(o.key_or_group, app).is_dir())
                 and not o.key_or_group.startswith("hydra")]
        structural = tuple(o.input_line for o in parsed if o not in plain)
        try:
            if structural not in composed:
                composed[structural] = compose(config_name=app, overrides=list(structural))
            cfg = composed[structural].copy()
            try:
                for o in plain:
                    OmegaConf.update(cfg, o.key_or_group, o.value(), merge=False, force_add=False)
            except Exception:  # noqa: BLE001 - a key the copy cannot take as Hydra would: compose it
                cfg = compose(config_name=app, overrides=overrides)
        except Exception as error:  # noqa: BLE001 - a job Hydra cannot compose (~attention.inner where one job has none)
            said = misspelled_key(app, overrides, compose, error)
            if said is None:
                raise
            swept = " ".join(o for o in overrides if o not in jobs[0]) or "its overrides as given"
            raise ConfigFileError(f"sweep job {len(configs)} ({swept}): {said}; no job was run") from None
        configs.append(cfg)
    return configs


def _added_key_problem(app: str, parsed, compose) -> str | None:
    """`+parent.key=value` that nothing reads: one line naming the key and the nearest known ones."""
    added = [o for o in parsed if (o.is_add() or o.is_force_add()) and o.package is None and "." in o.key_or_group
             and "/" not in o.key_or_group and not o.key_or_group.startswith("hydra")]
    if not added:
        return None
    from numdev.config.groups import app_defaults, unchosen_group

    replaced = _replaced(parsed)  # `~seed.init +seed.init=3`: judged where the key was
    rest = [o.input_line for o in parsed if o not in added and not o.is_sweep_override() and o not in replaced]
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    try:
        base = compose(config_name=app, overrides=rest)
    except Exception:  # noqa: BLE001 - Hydra says why when it runs
        return None
    for o in added:
        parts = o.key_or_group.split(".")
        node, depth, above = base, 0, None
        while depth < len(parts) - 1 and isinstance(node, DictConfig) and parts[depth] in node:
            node, above = node[parts[depth]], node
            depth += 1
        if depth == 0 and app_defaults(app).get(parts[0], "") is None and parts[0] not in swept:  # +study.role=x, no study
            return unchosen_group(app, o.input_line, parts[0], o.key_or_group, verb="read")
        if depth == 0 or not isinstance(node, DictConfig):
            continue  # an unknown top level: numdev.config.groups.unknown_top_level_key
        if depth >= 2 and _open_mapping(above.get("_target_"), parts[depth - 1]):
            continue  # a mapping the constructor takes whole (model=hf's model.config): its keys are its own to check
        parent, name = ".".join(parts[:depth]), parts[depth]
        if depth == len(parts) - 1 and name in node:
            continue  # ++key=value over a key that exists
        value = o.value()
        if depth == len(parts) - 1 and isinstance(value, dict):
            continue  # a new node (e.g. a callback of its own with its _target_)
        known = [str(k) for k in node.keys() if not str(k).startswith("_")]
        target = node.get("_target_") if depth == len(parts) - 1 else None
        if target is not None:
            takes = keyword_parameters(str(target))
            if takes is None or name in takes:
                continue  # the constructor takes it (or any keyword)
            known = sorted(set(known) | takes)
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(f'{parent}.{k}' for k in near)}? " if near else ""
        owner = f"{parent} ({target})" if target is not None else parent
        listed = f"its settings are {', '.join(known) or 'none'} " if len(known) <= 12 else ""
        said = hint + listed
        return (f"{o.input_line}: {owner} has no setting {name}, so nothing would read it{': ' + said if said else ' '}"
                f"(numdev-{app} --cfg job shows every key)")
    return None


def _deleted_and_read(app: str, message: str, parsed) -> str:
    """A check's message about a key the command deleted (`~seed.init`: "seed.init=None must be ..."), said as the
    deletion it is; any other message as it is."""
    for o in parsed:
        if o.is_delete() and message.startswith(f"{o.key_or_group}=None "):
            said = f"{o.input_line}: numdev-{app} reads {o.key_or_group}, which {message.split(' ', 1)[1]}"
            if re.search(rf"set {re.escape(o.key_or_group)}=\S+$", message):  # the check already names the value to set
                return f"{said} instead of deleting it"
            return f"{said}: set a value ({o.key_or_group}=...) instead of deleting it"
    return message


def _under(key: str, node: str) -> bool:
    """Whether `key` is the setting `node` or lies under it (seed.init under seed; seed.initial is not)."""
    return key == node or key.startswith(node + ".")


def _replaced(parsed) -> list:
    """The deletions the command adds back after them (`~seed.init +seed.init=3`, or ++): a replacement, not a key gone."""
    return [d for i, d in enumerate(parsed) if d.is_delete() and any(
        (a.is_add() or a.is_force_add()) and _under(a.key_or_group, d.key_or_group) for a in parsed[i + 1:])]


def _without(app: str, parsed, deleted: list, compose) -> DictConfig | None:
    """The config the command composes without its deletions (`deleted`) and sweeps; None when Hydra cannot compose it
    (Hydra says why when it runs). A key added back after its deletion (`~seed.init +seed.init=3`) is left as it was."""
    def readds(o) -> bool:
        return (o.is_add() or o.is_force_add()) and any(_under(o.key_or_group, d.key_or_group) for d in deleted)

    try:
        return compose(config_name=app, overrides=[o.input_line for o in parsed
                                                   if o not in deleted and not o.is_sweep_override() and not readds(o)])
    except Exception:  # noqa: BLE001 - Hydra's own message
        return None


def _set_and_deleted(parsed) -> str | None:
    """One key both deleted and set, in an order Hydra cannot make sense of (it applies overrides in order):
    `~seed.init seed.init=3` (Hydra cannot set a deleted key: several lines) or `seed.init=0,1 ~seed.init` (every job's
    value deleted again: the sweep's jobs would be one run). A key under a deleted one counts too. `key=0 ~key` (a
    null given a value so that Hydra can delete it) and `~key +key=value` (added back) are what they say."""
    settings = [o for o in parsed if o.package is None]
    for i, d in enumerate(settings):
        if not d.is_delete() or "." not in d.key_or_group:
            continue
        for o in settings[:i]:
            if o.is_sweep_override() and _under(o.key_or_group, d.key_or_group):
                return (f"{o.input_line} {d.input_line}: the sweep sets {o.key_or_group} and {d.input_line} then deletes it in "
                        f"every job (Hydra applies overrides in order), so its jobs would be one run: drop {d.input_line}")
        for o in settings[i + 1:]:
            if not (o.is_delete() or o.is_add() or o.is_force_add()) and _under(o.key_or_group, d.key_or_group):
                what = "then set" if o.key_or_group == d.key_or_group else f"then {o.key_or_group}, under it, is set"
                return (f"{d.input_line} {o.input_line}: {d.key_or_group} is deleted and {what}, and Hydra cannot set a "
                        f"deleted key: drop {d.input_line} ({o.input_line} changes the value)")
    return None


def _deletion_order_problem(app: str, parsed, compose) -> str | None:
    """`~seed.init ~seed.data` where seed.data is ${seed.init}: Hydra reads a key's value as it deletes it, so the
    second deletion fails on the first ("Interpolation key not found", several lines); the other order works."""
    deleted = [o for o in parsed if o.is_delete() and o.package is None and not o.key_or_group.startswith("hydra")]
    if len(deleted) < 2:
        return None
    base = _without(app, parsed, deleted, compose)
    if base is None:
        return None
    for i, o in enumerate(deleted):
        for earlier in deleted[:i]:
            if any(_under(path, o.key_or_group)
                   for path, _ in _interpolations_of(base, earlier.key_or_group, set())):
                return (f"{earlier.input_line} {o.input_line}: {o.key_or_group} reads {earlier.key_or_group}, and Hydra reads a "
                        f"key as it deletes it: delete {o.key_or_group} first ({o.input_line} {earlier.input_line})")
    return None


def _deleted_key_problem(app: str, parsed, compose) -> str | None:
    """`~model.depth`: a key deleted from a node whose constructor needs it (no default), which would
    fail after the run's directory exists. A key the constructor does not take (`~model.width` for a
    user's model without one) or takes with a default may go."""
    replaced = _replaced(parsed)
    deleted = [o for o in parsed if o.is_delete() and o.package is None and "." in o.key_or_group
               and not o.key_or_group.startswith("hydra") and o not in replaced]
    if not deleted:
        return None
    base = _without(app, parsed, deleted, compose)
    if base is None:
        return None
    gone = {o.key_or_group for o in deleted}
    for o in deleted:
        readers = _interpolations_of(base, o.key_or_group, gone)
        if readers:
            path, value = readers[0]
            return (f"{o.input_line}: {path} reads it ({value}), so deleting it would fail when the config is read: set a "
                    f"value ({o.key_or_group}=...) instead, or set {path} too")
    for o in deleted:
        parent, name = o.key_or_group.rsplit(".", 1)
        node = OmegaConf.select(base, parent, default=None)
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        parameter = constructor_parameter(target, name) if target is not None else None  # no constructor: the checks read it
        if parameter is not None and parameter.default is inspect.Parameter.empty and parameter.kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return (f"{o.input_line}: {parent} ({target}) needs {name} (it has no default), so the run would fail after "
                    f"its directory exists: set it ({o.key_or_group}=...) instead of deleting it")
    return None


def _interpolations_of(cfg: DictConfig, key: str, gone: set[str]) -> list[tuple[str, str]]:
    """The settings (path, its text) that interpolate `key` (${key} or ${key.<sub>}), leaving out settings that are
    themselves deleted (`gone`) or under one; empty when nothing reads it (or the config cannot be walked)."""
    import re

    pattern = re.compile(r"\$\{" + re.escape(key) + r"[}.]")
    found = []
    def walk(node, prefix):
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            path = f"{prefix}.{k}" if prefix else str(k)
            if any(_under(path, g) for g in gone):
                continue
            if isinstance(v, (dict, list)):
                walk(v, path)
            elif isinstance(v, str) and pattern.search(v):
                found.append((path, v))

    try:
        walk(OmegaConf.to_container(cfg, resolve=False), "")
    except Exception:  # noqa: BLE001 - a config that cannot be read: the run says what it can
        return []
    return found


def constructor_parameter(target, name: str) -> inspect.Parameter | None:
    """The parameter `name` of a `_target_`'s constructor (None: not importable, no signature, or no such parameter)."""
    from hydra.utils import get_object

    try:
        return inspect.signature(get_object(str(target))).parameters.get(name)
    except Exception:  # noqa: BLE001 - not importable or no signature: the constructor will say
        return None


def _open_mapping(target, name: str) -> bool:
    """Whether `_target_` takes its argument `name` as a whole mapping (annotated dict), whose keys it checks itself."""
    parameter = constructor_parameter(target, name) if target is not None else None
    annotation = parameter.annotation if parameter is not None else None
    return annotation is dict or (isinstance(annotation, str) and (annotation == "dict" or annotation.startswith("dict[")))


def keyword_parameters(target: str) -> set[str] | None:
    """The keyword arguments a `_target_` takes; None when it takes any (**kwargs) or cannot be told."""
    from hydra.utils import get_object

    try:
        signature = inspect.signature(get_object(target))
    except Exception:  # noqa: BLE001 - not importable or no signature: the constructor will say
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return {name for name, p in signature.parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY)}


def _register_launcher() -> None:
    """hydra/launcher=parallel's plugin class, registered by Hydra's public API: Hydra finds plugins by
    scanning the hydra_plugins package, which an editable install's import hook (pip install -e)
    hides from that scan, so a sweep would fail with "Unknown plugin class"."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.numdev_launcher.parallel_launcher import ParallelLauncher

    Plugins.instance().register(ParallelLauncher)


# Hydra's own tools, whose argument is not an override: `-sc install=bash` (shell completion).
HYDRA_TOOL_FLAGS = {"-sc", "--shell-completion"}


def checked_overrides(program: str, app: str, check=None, check_sweep=None):
    """Decorate a Hydra app's entry point (outside @hydra.main): before Hydra composes, an override
    whose key belongs to another option of its group or to the other app is one line naming the fix
    (numdev.config.groups.override_mistake), where Hydra's own hint would point the wrong way; then
    every job's config is checked by `check` (problem, above) before Hydra creates a directory."""
    from numdev.cli.errors import fail, note_existing_run_dir, output_dir_problem
    from numdev.config import groups as config_groups

    config_groups.register_resolver()  # --help lists the app's own groups (conf/hydra/help/numdev.yaml)
    _register_launcher()

    def decorate(main):
        @functools.wraps(main)
        def wrapper(*args, **kwargs):
            if not args and not kwargs and not HYDRA_TOOL_FLAGS & set(sys.argv[1:]):  # a run's command line (not a test
                given = sys.argv[1:]  # passing a config, not Hydra's shell completion)
                mistake = config_groups.override_mistake(app, given) or output_dir_problem(given)
                compose = Composer()  # one composition of each config for both checks
                if not mistake and check_sweep is not None:  # before `check`, which may import torch: answers in a second
                    mistake = sweep_problem(app, given, check_sweep, compose)
                if not mistake and check is not None:
                    mistake = problem(app, given, check, compose)
                if mistake:
                    fail(program, mistake)
                note_existing_run_dir(given)
            return main(*args, **kwargs)

        return wrapper

    return decorate
