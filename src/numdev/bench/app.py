"""numdev-bench: the Hydra app of the microbenchmark. Each run appends its records to
results.jsonl in its run directory as they are computed; a sweep is a Hydra multirun (-m).

Interrupted (SIGTERM, SIGHUP, Ctrl-C), a run keeps every record computed so far and says so in one
line. Rerun with the same command and directory, it appends only what is not there yet: a record
measuring what one already in the file measures (numdev.bench.gather.record_key) is not written
twice, so gather never counts a measurement twice."""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import threading
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from numdev.bench.echo import settings_line
from numdev.bench.gather import record_key
from numdev.cli import logs
from numdev.cli.errors import RunFailed, user_facing
from numdev.cli.workers import console_script
from numdev.config.groups import unexpected_key
from numdev.config.preflight import checked_overrides
from numdev.runs.atomic import append_jsonl, read_jsonl, write_json
from numdev.runs.layout import INTERRUPTED, RESULTS
from numdev.runs.provenance import provenance

log = logging.getLogger("numdev.bench.app")  # by name: also when run as python -m numdev.bench.app


# torch is imported when a run needs it, not before: `--help`, a misspelled key or an unknown option
# come back in about a second (scripts/bench_startup.py).
def check_config(cfg: DictConfig) -> None:
    """numdev.bench.runner.check_config, imported when a composed config is checked."""
    from numdev.bench.runner import check_config as check

    check(cfg)


@checked_overrides("numdev-bench", "bench", check_config)
@hydra.main(config_path="pkg://numdev.conf.bench", config_name="bench", version_base="1.3")
@user_facing("numdev-bench", unexpected_key)
def run(cfg: DictConfig) -> None:
    import torch

    from numdev.bench.runner import run_bench
    from numdev.config.schema import BENCH, validate

    logs.setup(cfg.get("verbose"))
    validate(cfg, BENCH)  # every declared key's type and range (numdev.config.schema)
    hydra_cfg = HydraConfig.get()
    with open_dict(cfg):
        cfg.experiment_name = cfg.name
        cfg.overrides = list(hydra_cfg.overrides.task)
    job = hydra_cfg.job.num if hydra_cfg.mode.name == "MULTIRUN" else None
    log.info(settings_line(cfg, dict(hydra_cfg.runtime.choices), job))
    if cfg.get("threads") is not None:
        torch.set_num_threads(int(cfg.threads))
    run_dir = Path(hydra_cfg.runtime.output_dir)
    results = run_dir / RESULTS
    block = provenance(seeds=[int(s) for s in cfg.seeds])  # each record says where it was measured
    present = {record_key(r) for r in read_jsonl(results)} if results.is_file() else set()  # an earlier, interrupted run's
    kept = []

    def write(records):
        new = [r for r in records if record_key(r) not in present]
        kept.extend(r for r in records if record_key(r) in present)
        append_jsonl(results, [{**record, "provenance": block} for record in new])
        present.update(record_key(r) for r in new)

    # Each record is appended as soon as it is computed (one atomic append: concurrent runs sharing
    # the file keep every record), so a method that fails later, or a signal, loses none of the earlier ones.
    with _signals_end_the_run(results):
        if cfg.get("runner") is not None:  # a whole-grid experiment (numdev.figures.reconcile, bias)
            runner = instantiate(cfg.runner)
            if "emit" in inspect.signature(runner.__call__).parameters:
                records = runner(cfg, emit=lambda record: write([record]))
            else:  # a runner that returns its records at the end
                records = runner(cfg)
                write(records)
        else:
            records = run_bench(cfg, emit=lambda record: write([record]))
    (run_dir / INTERRUPTED).unlink(missing_ok=True)  # this run completed the job
    if kept:
        log.info(f"{len(kept)} record(s) were already in {results} from an earlier run of this job: kept, not written twice")
    skipped = sum(r["kind"] == "skipped" for r in records)
    log.info(f"{len(records)} records -> {results}" + (f" ({skipped} skipped: not enough memory)" if skipped else ""))
    if cfg.get("figure") and hydra_cfg.mode == RunMode.RUN:  # a sweep draws its figure when it ends
        from numdev.bench.figure import announce, make_figure

        announce(cfg.figure, make_figure(cfg.figure, run_dir), run_dir)


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_end_the_run(results: Path):
    """SIGTERM and SIGHUP (whose default actions end the process without a word) and Ctrl-C end the
    run with one line saying what was kept and how to complete it; exit 128 + the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum, frame):
        raise _Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except (_Interrupted, KeyboardInterrupt) as error:
        signum = error.signum if isinstance(error, _Interrupted) else signal.SIGINT
        kept = len(read_jsonl(results)) if results.is_file() else 0
        # gather refuses the job until a rerun completes it (numdev.bench.gather, INTERRUPTED)
        write_json(results.parent / INTERRUPTED, {"signal": signal.Signals(signum).name, "records": kept})
        raise RunFailed(
            f"interrupted by {signal.Signals(signum).name}: the {kept} record(s) computed so far are in {results}; to complete "
            f"the run, rerun the same command with hydra.run.dir={results.parent} (records already there are not written twice)",
            128 + signum,
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    """numdev-bench: the Hydra app, as a console script (numdev.cli.workers.console_script)."""
    console_script(run)


if __name__ == "__main__":
    main()
