"""Which config groups, options and keys each app (bench, train) has, read from the installed conf.

Each app has its own config root, conf/<app>/ (installed as numdev.conf.<app>: its primary config
<app>.yaml and its own groups, experiments included); the groups both apps use (attention, and
numdev's hydra/ options) live once in conf/ and reach both through Hydra's search path (numdev.config.search_path). Hydra's errors cannot say that a key belongs to another option
of its group, or to the other app; this module knows, from the YAML files themselves:
  - an app's groups: the groups of its primary config's defaults list;
  - a group's options (the app's own folder, else the shared one), and which app an experiment is for;
  - the keys each option sets (following its defaults to other options of the same group).
It feeds `--help` (the `numdev_groups` resolver) and the override checks (numdev.config.preflight).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

APPS = ("bench", "train")


def conf_dir() -> Path:
    """conf/ (numdev.conf): the shared groups, and one folder per app."""
    import numdev.conf

    return Path(numdev.conf.__file__).parent


def config_module(app: str) -> str:
    """The package Hydra composes an app's config from (initialize_config_module, hydra.main's pkg://)."""
    return f"numdev.conf.{app}"


def group_dir(group: str, app: str | None = None) -> Path:
    """The folder of a group's options: the app's own (conf/<app>/<group>; any app's when app is None),
    else the shared one (conf/<group>)."""
    for owner in [app] if app is not None else APPS:
        folder = conf_dir() / owner / group
        if folder.is_dir():
            return folder
    return conf_dir() / group


@cache
def _load(path: Path) -> dict:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _defaults(path: Path) -> list:
    defaults = _load(path).get("defaults") if path.is_file() else None
    return defaults if isinstance(defaults, list) else []


def app_defaults(app: str) -> dict[str, str | None]:
    """{group: default option} of an app's primary config (`attention@shadow` counts as `attention`)."""
    chosen = {}
    for entry in _defaults(conf_dir() / app / f"{app}.yaml"):
        if isinstance(entry, dict):
            for key, option in entry.items():
                group = key.split("@")[0].replace("override ", "").strip().lstrip("/")
                if group.startswith("hydra"):
                    continue
                if "@" not in key or group not in chosen:
                    chosen[group] = option
    return chosen


def options(group: str, app: str | None = None) -> list[str]:
    """The options of a group; for `experiment`, those of `app` (of both apps when app is None)."""
    if group == "experiment" and app is None:
        return sorted(name for owner in APPS for name in options(group, owner))
    return sorted(p.stem for p in group_dir(group, app).glob("*.yaml"))


def experiment_app(name: str) -> str | None:
    """The app an experiment is for: the app whose conf/<app>/experiment/ holds it (None: neither)."""
    found = [app for app in APPS if (conf_dir() / app / "experiment" / f"{name}.yaml").is_file()]
    return found[0] if len(found) == 1 else None


def group_app(group: str) -> list[str]:
    """The apps whose primary config has this group."""
    return [app for app in APPS if group in app_defaults(app)]


def is_global(group: str, app: str | None = None) -> bool:
    """Options that write at the top level (# @package _global_): their keys are not under the group."""
    return any("@package _global_" in p.read_text(encoding="utf-8") for p in group_dir(group, app).glob("*.yaml"))


def option_keys(group: str, option: str, app: str | None = None) -> set[str]:
    """The top-level keys an option sets, with those of the same-group options in its defaults."""
    path = group_dir(group, app) / f"{option}.yaml"
    keys = {k for k in _load(path) if k != "defaults"} if path.is_file() else set()
    for entry in _defaults(path):
        if isinstance(entry, str) and entry != "_self_":
            keys |= option_keys(group, entry.lstrip("/").removeprefix(f"{group}/"), app)
    return keys


def experiment_choices(experiment: str, app: str) -> dict[str, str]:
    """{group: option} that an experiment of `app` selects with `override /group: option`."""
    chosen = {}
    for entry in _defaults(group_dir("experiment", app) / f"{experiment}.yaml"):
        if isinstance(entry, dict):
            for key, option in entry.items():
                chosen[key.replace("override ", "").strip().lstrip("/")] = option
    return chosen


def option_choices(group: str, option: str, app: str) -> dict[str, str]:
    """{group: option} that an option file selects with `override /group: option` (model=gpt_tiny: the objective,
    data and callbacks), with those of the same-group options in its defaults (model=custom's, for a file based on it)."""
    path = group_dir(group, app) / f"{option}.yaml"
    chosen = {}
    for entry in _defaults(path):
        if isinstance(entry, str) and entry != "_self_" and not entry.startswith("/"):
            chosen.update(option_choices(group, entry.removeprefix(f"{group}/"), app))
        elif isinstance(entry, dict):
            for key, value in entry.items():
                if key.startswith("override "):
                    chosen[key.replace("override ", "").strip().lstrip("/")] = value
    return chosen


def help_groups(app: str) -> str:
    """The `== Configuration groups ==` body of `numdev-<app> --help`: this app's groups only."""
    lines = []
    for group in app_defaults(app):
        lines.append(f"{group}: {', '.join(options(group, app))}")
    hydra_groups = sorted(p.name for p in (conf_dir() / "hydra").iterdir() if p.is_dir() and p.name != "help")
    for group in hydra_groups:
        lines.append(f"hydra/{group}: {', '.join(options(f'hydra/{group}'))}")
    return "\n".join(lines)


def _measured_walls(app: str) -> dict[str, tuple[float, str]]:
    """{experiment: (wall seconds, machine and disk where recorded)} from the checkout's study benchmarks (docs/results/bench_study_*.json,
    scripts/bench_study.py), each the fastest run of the experiment's own command with no other override (a
    loaded machine's run is slower, not the experiment); {} in an installed numdev without the docs."""
    import json

    found: dict[str, tuple[float, str]] = {}
    for path in sorted((conf_dir().parent / "docs" / "results").glob("bench_study_*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            words = str(data["command"]).split()
            wall = float(data["median_wall_s"])
            machine = ((data.get("provenance") or {}).get("machine") or {}).get("cpu", "?")
            disks = [r["disk_bytes"] for r in data.get("repeats", []) if isinstance(r.get("disk_bytes"), int)]
            if disks:  # scripts/bench_study.py records what the study left on disk (since it does)
                machine += f", {max(disks) / 1e9:.1f} GB on disk"
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not one of the benchmarks' files, or a damaged one: no timing shown
        rest = [w for w in words[2:] if w != "trainer.enable_progress_bar=false"]
        match = re.fullmatch(r"experiment=([\w-]+)", words[1]) if len(words) > 1 and words[0] == f"numdev-{app}" else None
        if match and not rest and (match[1] not in found or wall < found[match[1]][0]):
            found[match[1]] = (wall, machine)
    return found


def help_experiments(app: str) -> str:
    """The `== Experiments ==` body of `numdev-<app> --help`: each experiment's first comment line and, where
    the study benchmarks measured it, how long it took on the 2-core machine."""
    walls = _measured_walls(app)
    lines = []
    for name in options("experiment", app):
        text = (group_dir("experiment", app) / f"{name}.yaml").read_text(encoding="utf-8", errors="replace").splitlines()
        block = []
        for line in text:  # the leading comment, up to its example commands
            if not line.startswith("#") or line.lstrip("# ").startswith("numdev-"):
                if block:
                    break
                continue
            if "@package" not in line:
                block.append(line.lstrip("# ").strip())
        joined = " ".join(block)
        about = re.split(r"\.\s+(?=[A-Z])", joined)[0].rstrip(".:")  # its first sentence ("Figs. 7-8" is not an end)
        about = about if len(about) <= 150 else about[:149].rsplit(" ", 1)[0] + "…"
        took = f" [measured: {walls[name][0] / 60:.0f} min on {walls[name][1]}, 2 cores]" if name in walls else ""
        lines.append(f"experiment={name}: {about}{took}")
    return "\n".join(lines)


def register_resolver() -> None:
    """`${numdev_groups:bench}` and `${numdev_experiments:bench}` in conf/hydra/help/numdev.yaml."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("numdev_groups"):
        OmegaConf.register_new_resolver("numdev_groups", help_groups)
    if not OmegaConf.has_resolver("numdev_experiments"):
        OmegaConf.register_new_resolver("numdev_experiments", help_experiments)


def override_mistake(app: str, args: list[str]) -> str | None:
    """A command-line override that Hydra would reject or misread, as one line naming the fix; None if fine.

    Caught here, before Hydra composes, because Hydra's own message points the wrong way:
      - `data.root=/x` with data=shapes: Hydra suggests `+data.root`, which then fails in the
        constructor. The fix is `data=folder data.root=/x`.
      - a group or experiment of the other app (`numdev-bench trainer=gpu`, `numdev-bench
        experiment=flash_stability`): the fix is the other command.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from numdev.cli.commands import script

    candidates = command_overrides(args)
    missing = searchpath_missing(candidates)
    if missing:
        return missing
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except HydraException:
        return None  # a syntax error: Hydra's own message is the right one
    if {"--help", "-h"} & set(args) and any(o.is_sweep_override() for o in overrides):
        return ("--help with a sweep (a,b,c): Hydra's help cannot read sweeps and would fail on them; "
                "drop -m and give one value of each to see the groups and that job's config")
    unknown = unknown_top_level_key(app, overrides) or deleted_section(app, overrides)
    if unknown:
        return unknown
    mine = app_defaults(app)
    merged = merged_options(app, overrides)
    if merged:
        return merged
    other = [a for a in APPS if a != app]
    me = script(f"numdev-{app}")
    chosen = dict(mine)
    for o in overrides:  # the group choices in force: experiment's overrides, then the command line's
        if o.key_or_group == "experiment" and not o.is_sweep_override() and o.value():
            chosen.update({g: v for g, v in experiment_choices(str(o.value()), app).items() if g in mine})
    explicit = set()
    for o in overrides:
        if o.package is None and "." not in o.key_or_group and o.key_or_group in mine and not o.is_delete():
            chosen[o.key_or_group] = list(o.sweep_string_iterator()) if o.is_sweep_override() else o.value()
            explicit.add(o.key_or_group)
    for group, option in list(chosen.items()):  # an option that chooses other groups (model=gpt_tiny: data=text)
        if isinstance(option, str) and option in options(group, app):
            chosen.update({g: v for g, v in option_choices(group, option, app).items() if g in mine and g not in explicit})
    own_folder = any(a.startswith(("hydra.searchpath", "--config-dir", "-cd", "--config-path", "-cp")) for a in args)

    for o in overrides:
        name = o.key_or_group
        if name.startswith("hydra") or o.is_delete():
            continue
        group, _, key = name.partition(".")
        if not key:  # a group choice: group=option
            if group == "experiment" and not o.is_sweep_override() and o.value() is not None:
                owner = experiment_app(str(o.value()))
                if owner is not None and owner != app:
                    return (f"experiment={o.value()} is a numdev-{owner} experiment, not a numdev-{app} one: "
                            f"run {script(f'numdev-{owner}')} experiment={o.value()} (numdev-{app} has: {', '.join(options('experiment', app))})")
            if group not in mine and (owners := [a for a in other if group in app_defaults(a)]):
                return (f"{group} is a config group of numdev-{owners[0]}, not of numdev-{app}: run {script(f'numdev-{owners[0]}')} {o.input_line} "
                        f"(numdev-{app}'s groups: {', '.join(mine)}; see numdev-{app} --help)")
            continue
        if group not in mine:
            if (owners := [a for a in other if group in app_defaults(a)]) and not o.is_add():
                return (f"{name} is a setting of numdev-{owners[0]}, not of numdev-{app}: run {script(f'numdev-{owners[0]}')} {o.input_line} "
                        f"(numdev-{app}'s groups: {', '.join(mine)})")
            continue
        if o.package is not None or is_global(group, app) or not isinstance(chosen.get(group), str) or own_folder:
            continue  # a sweep over the group's options, options that write elsewhere, a user's own options: Hydra checks
        top = key.split(".")[0]
        option = chosen[group]
        if option not in options(group, app) or top in option_keys(group, option, app):
            continue  # an unknown option: Hydra's own error lists the options
        having = [opt for opt in options(group, app) if top in option_keys(group, opt, app)]
        nulls = all(v is None for v in o.sweep_iterator()) if o.is_sweep_override() else o.value() is None
        if having and nulls:  # `attention.inner=null`: nothing to make null
            return (f"{o.input_line}: {group}={option} (the {group} in use) has no {top}, so there is nothing to make null: "
                    f"drop it ({top} is a setting of {' or '.join(f'{group}={h}' for h in having)})")
        if having:
            fix, line, aside = f"{group}={having[0]}", o.input_line.lstrip("+"), ""
            if o.is_sweep_override() and any(v is None for v in o.sweep_iterator()):  # `attention.factor=null,2`
                kept = [str(v) for v in o.sweep_string_iterator() if v != "null"]
                line = f"{name}={','.join(kept)}"
                aside = f" (the job with null is {group}={option} as it is, which has no {top}: run it on its own)"
            return (f"{group}.{top} is a setting of {' or '.join(f'{group}={h}' for h in having)}, not of {group}={option} "
                    f"(the {group} in use): choose it too, e.g. {me} {fix} {line}{aside}")
    if not own_folder:
        unknown = unknown_option(app, overrides)  # a user's own config folder may hold options numdev does not know
        if unknown:
            return unknown
    return unknown_group(app, overrides)


def unchosen_group(app: str, line: str, group: str, key: str, verb: str = "set") -> str:
    """The message for `study.role=x` (verb "set") or `+study.role=x` ("read") where the group study has no option in
    force, so its keys are not in the config: Hydra refuses the first in several lines and takes the second unread."""
    known = options(group, app)
    there = f"there is no {key} to set" if verb == "set" else f"nothing would read {key}"
    return (f"{line}: no {group} is chosen (the group {group} has no default option), so {there}: choose one first "
            f"({group}=<option>, one of {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}; numdev-{app} --help lists them)")


def searchpath_missing(args: list[str]) -> str | None:
    """`hydra.searchpath=[file://<folder>]` naming a folder that does not exist: Hydra would ignore it and then say
    only that the option it holds is not among numdev's."""
    for arg in args:
        if arg.startswith(("hydra.searchpath=", "+hydra.searchpath=")):
            for entry in arg.split("=", 1)[1].strip("[]").split(","):
                entry = entry.strip().strip("'\"")
                if entry.startswith("file://") and not Path(entry.removeprefix("file://")).is_dir():
                    return (f"hydra.searchpath: {entry} is not a folder: give the folder that holds your option files "
                            "(file://<absolute path>; its model/, data/, ... subfolders hold the options)")
    return None


MULTI_OPTION_GROUPS = {"logger"}  # each option sits under its own name (logger.<name>): a list combines them (numdev.train.trackers)


def merged_options(app: str, overrides) -> str | None:
    """`optimization=[fp8_linear,fused_adamw]`: a list of options for a group. Hydra merges them into
    one node, the later option's values over the earlier's (one _target_, one name), so only one of
    them is applied and the record names that one. Every numdev group but MULTI_OPTION_GROUPS takes one
    option: refused in one line (an empty list, `logger=[]`, still means none, and a list of one is that
    option)."""
    groups = set(app_defaults(app)) - MULTI_OPTION_GROUPS
    for o in overrides:
        name = o.key_or_group
        if "." in name or "/" in name or name.startswith("hydra") or o.is_delete() or name not in groups:
            continue
        values = o.value().list if o.is_sweep_override() and hasattr(o.value(), "list") else [o.value()]
        for value in values:
            if isinstance(value, (list, tuple)) and len(value) > 1:
                where = f"{name}@{o.package}" if o.package else name
                listed = ",".join(str(v) for v in value)
                return (f"{o.input_line}: {where} takes one option, not a list: Hydra would merge {', '.join(map(str, value))} "
                        f"into one (the last one's values win) and run only one of them; choose one ({where}={value[-1]}), "
                        f"or run each in a sweep (-m {where}={listed})")
    return None


def top_level_keys(app: str) -> set[str]:
    """Every top-level key an app's config can have: its primary config's own keys, its groups (and
    the packages they are placed at), and the keys its global options (experiments, studies) set."""
    keys = {k for k in _load(conf_dir() / app / f"{app}.yaml") if k != "defaults"}
    for entry in _defaults(conf_dir() / app / f"{app}.yaml"):
        if isinstance(entry, dict):
            for key in entry:
                group, _, package = key.replace("override ", "").strip().lstrip("/").partition("@")
                keys.add((package or group).split(".")[0].split("/")[0])
    for group in app_defaults(app):
        if group_dir(group, app).is_dir() and is_global(group, app):
            for option in options(group, app):
                keys |= option_keys(group, option, app)
    return keys - {"hydra"}


def _leaf_paths(app: str) -> dict[str, list[str]]:
    """{leaf key: [its dotted paths]} in the app's primary config and its default options."""
    paths: dict[str, list[str]] = {}

    def walk(tree, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                if key in ("defaults", "hydra") and not prefix:
                    continue
                walk(value, f"{prefix}{key}.")
        elif prefix:
            path = prefix.rstrip(".")
            paths.setdefault(path.rsplit(".", 1)[-1], []).append(path)

    walk(_load(conf_dir() / app / f"{app}.yaml"), "")
    for group, option in app_defaults(app).items():
        path = group_dir(group, app) / f"{option}.yaml"
        if isinstance(option, str) and path.is_file() and not is_global(group, app):
            walk(_load(path), f"{group}.")
    return paths


def command_overrides(args: list[str]) -> list[str]:
    """The Hydra overrides of a command line: key=value, +key=value, ++key=value and ~key[=value]
    (a deletion need not have a value); not its flags (-m, --cfg job, ...)."""
    return [a for a in args if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def deleted_section(app: str, overrides) -> str | None:
    """`~trainer`, `~attention`, `~threads`: a whole section of the app's config deleted. The app reads
    every one of them, so the run would fail with a traceback after its directory exists; deeper keys
    (`~model.width`, for a user's model that takes no width) are left to the checks of the config."""
    groups, primary = set(app_defaults(app)), _load(conf_dir() / app / f"{app}.yaml")
    for o in overrides:
        top = o.key_or_group.split("@")[0]
        if not o.is_delete() or "." in top or top not in top_level_keys(app) | groups:
            continue
        fix = (f"choose another option ({top}=...) or change its keys ({top}.<key>=...)" if top in groups
               else f"change its keys ({top}.<key>=...)" if isinstance(primary.get(top), dict) else f"set a value ({top}=...)")
        return (f"{o.input_line}: numdev-{app} reads {top} on every run, so deleting it would fail after the run's "
                f"directory exists: {fix} instead (numdev-{app} --cfg job shows every key)")
    return None


def unknown_top_level_key(app: str, overrides) -> str | None:
    """`+lr=0.5`: a key added at the top level that nothing of the app reads (it would be accepted
    and ignored); the message names the key and, where one exists, the setting of that name."""
    known = top_level_keys(app)
    groups = set(app_defaults(app))
    for o in overrides:
        name = o.key_or_group
        top = name.split(".")[0].split("@")[0]
        if not (o.is_add() or o.is_force_add()) or name.startswith("hydra") or top in known or top in groups:
            continue
        leaf = name.rsplit(".", 1)[-1]
        similar = _leaf_paths(app).get(leaf, []) or ([] if "." in name else nearest(top, sorted(known | groups)))
        hint = f"; did you mean {similar[0]}={o.input_line.split('=', 1)[-1]}?" if similar else ""
        return (f"{o.input_line}: {top} is not a setting of numdev-{app}, and nothing would read it{hint} "
                f"(numdev-{app} --help lists its groups; --cfg job shows every key)")
    return None


def nearest(name: str, known: list[str]) -> list[str]:
    """The known names closest to a misspelled one (difflib), best first."""
    import difflib

    return difflib.get_close_matches(name, known, n=3, cutoff=0.6)


def unknown_option(app: str, overrides) -> str | None:
    """`attention=flash_emulate`: an option its group does not have. Hydra's message is several lines
    listing every option and the search path; this is one line with the nearest options (a sweep's or a
    list's every value is checked; a group set to null is one line too: Hydra fails on it with a traceback)."""
    groups = set(app_defaults(app))
    for o in overrides:
        name = o.key_or_group
        if "." in name or name.startswith("hydra") or o.is_delete() or name not in groups or not group_dir(name, app).is_dir():
            continue
        known = options(name, app)
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        for value in values:
            if value is None:  # Hydra itself fails on it with a traceback
                return (f"{o.input_line}: a config group cannot be set to null: to choose none of its options, remove it "
                        f"with ~{name} (or {name}=[])")
            for one in value if isinstance(value, (list, tuple)) else [value]:
                if one is None or not isinstance(one, str) or one in known or "${" in one or "/" in one:
                    continue
                near = nearest(one, known)
                hint = f"did you mean {' or '.join(f'{name}={n}' for n in near)}? " if near else ""
                where = f"{name}@{o.package}" if o.package else name
                return (f"{o.input_line}: {where} has no option {one!r}: {hint}(its options: {', '.join(known)}; "
                        f"conf/{group_dir(name, app).relative_to(conf_dir())}/)")
    return None


def unknown_group(app: str, overrides) -> str | None:
    """`numeric=fa2`: a group or key that the app does not have, set without `+`. Hydra's message
    suggests appending it (`+numeric=fa2`), which would then run silently on the defaults; the fix
    is almost always a spelling: this names the nearest groups and keys."""
    known = top_level_keys(app)
    groups = set(app_defaults(app))
    for o in overrides:
        name = o.key_or_group
        top = name.split(".")[0].split("/")[0]
        if o.is_add() or o.is_force_add() or o.is_delete() or o.package is not None or name.startswith("hydra"):
            continue
        if top in known or top in groups:
            continue
        near = nearest(top, sorted(known | groups))
        value = o.input_line.split("=", 1)[-1]
        hint = f"did you mean {' or '.join(f'{n}{name[len(top):]}={value}' for n in near)}? " if near else ""
        return (f"{o.input_line}: numdev-{app} has no group or setting {top}: {hint}"
                f"(its groups: {', '.join(app_defaults(app))}; numdev-{app} --help lists them)")
    return None


def unexpected_key(node: str, name: str) -> str:
    """The message for `+data.root=...` that reached a constructor without that argument."""
    group = node.split(".")[0]
    having = [opt for opt in options(group) if name in option_keys(group, opt)] if group_dir(group).is_dir() else []
    if having:
        return (f"{node}.{name} is not a setting of the chosen {group}: it is one of {' or '.join(f'{group}={h}' for h in having)}; "
                f"choose that option too ({group}={having[0]} {node}.{name}=...) instead of +{node}.{name}")
    return (f"{node}.{name} is not a setting of {node}: remove +{node}.{name} (or the experiment or config file that "
            "sets it for another option; see --help for the keys it has)")


def unimportable_target(node: str, target: str) -> str:
    """The message for a _target_ that cannot be imported (a misspelled class), with the module's nearest names."""
    import importlib

    module, _, name = target.rpartition(".")
    try:
        found = importlib.import_module(module) if module else None
        names = [n for n in dir(found) if not n.startswith("_") and callable(getattr(found, n))] if found else []
    except Exception:  # noqa: BLE001 - the module itself is misspelled or broken: no names to offer
        names = []
    near = nearest(name, names)
    hint = f"did you mean {' or '.join(f'{module}.{n}' for n in near)}?" if near else "check its spelling"
    return f"{node}._target_={target} cannot be imported: {hint}"


def refused(error: Exception) -> str:
    """One line for a constructor's refusal that is not a user error: a key its _target_ does not take is named
    with its config path (Hydra's full_key), nested ones (attention.inner.precision) with how to delete it; a _target_
    that cannot be imported with the module's nearest names (unimportable_target)."""
    from numdev.cli.errors import one_line

    cause = error.__cause__
    found = re.search(r"full_key: (\S+)", str(error))
    located = re.search(r"Error locating target '([^']+)'", str(error))
    if found and located:
        return unimportable_target(found.group(1), located.group(1))
    extra = re.search(r"unexpected keyword argument '(\w+)'", str(cause)) if isinstance(cause, TypeError) else None
    if not (found and extra):
        return one_line(error)
    node, name = found.group(1), extra.group(1)
    if "." not in node:
        return unexpected_key(node, name)
    return (f"{node}.{name} is not a setting of {node}'s _target_ ({one_line(cause)}): delete it with "
            f"'~{node}.{name}' or choose a _target_ that takes it")
