"""The suite's tiers, its threads per worker, and the checks that keep every test safe beside the others.

Tiers (README.md#tests): every test is in exactly one of `unit` (in-process), `cli` (real command
lines: a numdev console command or a script in a subprocess) and `faults` (real processes hit by real
faults: signals, kills, resume, a SLURM cluster, DDP); `slow` and `gpu` are marked on top. The tier of
each test is set here, in TIERS, and nowhere else: choose one with `-m unit`, `-m cli`, `-m faults`.

Run in parallel (`make test`: pytest-xdist, one worker per core), torch in each worker and in the
processes a test starts uses cores/workers threads (1 on 2 cores), so workers do not oversubscribe the
machine; NUMDEV_TEST_THREADS sets it. Tests that share a module-scoped fixture (one trained run, one
SLURM cluster) run on one worker, so it is built once.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from helpers import REPO, compose_train

# -- tiers -------------------------------------------------------------------------------------------
# A module name, or module::function for one test of a module whose other tests are in another tier.
# Anything not listed is `unit`. A unit test that starts a numdev command or a Python process fails
# (see _unit_tests_stay_in_process) with the line to add here.
TIERS = {
    "faults": (
        "test_faults.py",
        "test_slurm.py",
        "test_distributed.py::test_ddp_on_two_cpu_processes_matches_one_process_with_the_same_global_batch",
        "test_distributed.py::test_a_ddp_run_resumes_from_its_checkpoint_to_the_same_snapshots",
        "test_sweep_lifecycle.py::test_a_stopped_study_leaves_every_record_final_and_no_process_behind",
        "test_sweep_lifecycle.py::test_a_killed_worker_is_one_line_naming_its_job_and_every_record_is_final",
        "test_sweep_lifecycle.py::test_a_run_stops_waiting_for_a_dead_reference",
        "test_sweep_lifecycle.py::test_a_run_waiting_for_its_reference_honours_sigterm",
        "test_reliability_3.py::test_a_sweep_killed_outright_leaves_no_worker_behind",
        "test_gpu_call.py::test_a_step_past_its_limit_is_stopped_with_its_group_and_the_call_goes_on",
        "test_gpu_call.py::test_sigterm_to_the_call_stops_the_running_step_and_writes_the_record",
        "test_gpu_call.py::test_a_call_killed_outright_leaves_no_step_running",
        "test_scratch.py::test_a_folder_a_sigkill_left_is_removed_by_the_next_run_and_nothing_else_is",
        "test_gpu_kernels_script.py::test_a_sigterm_stops_the_workers_and_keeps_the_finished_cells",
        "test_kernel_sass_script.py::test_a_sigterm_stops_the_run_and_takes_its_scratch_and_cuobjdump_with_it",
    ),
    "cli": (
        "test_custom_model.py::test_the_user_model_goes_through_the_harm_study_unchanged",
        "test_language_model.py::test_the_language_model_goes_through_the_optimizations_study_unchanged",
        "test_ties.py::test_the_script_writes_its_json_and_refuses_bad_arguments",
        "test_hf_model.py::test_a_hugging_face_model_goes_through_the_harm_study_unchanged",
        "test_bench_app.py",
        "test_cli.py",
        "test_sweep_lifecycle.py::test_a_stopped_run_is_one_result_of_its_sweep_the_others_run_and_the_command_exits_1",
        "test_help.py::test_hydra_apps_answer_help_and_config_mistakes_without_torch",
        "test_flash_speed.py::test_compiled_path_matches_frozen_reference",  # inductor checks its C++ compiler in a subprocess when its cache is cold
        "test_attention.py::test_cpu_sdpa_lane_width_follows_the_build_avx2_subprocess",
        "test_attention.py::test_cpu_sdpa_packs_where_the_kernel_packs_subprocess",
        "test_bad_input_catalogue.py::test_a_mistake_is_one_line_from_the_real_command",
        "test_early.py::test_flash_is_told_apart_from_the_ulp_control_at_step_2_in_bf16",
        "test_early.py::test_the_ladder_recovers_a_planted_eps",
        "test_gpu_call.py::test_the_whole_call_rehearses_on_the_cpu",
        "test_lr_edge.py",
        "test_script_entry.py::test_run_script_turns_user_errors_into_one_line_and_passes_exit_codes_on",
        "test_script_entry.py::test_a_bug_keeps_its_traceback",
        "test_script_entry.py::test_a_reader_that_goes_away_is_no_traceback",
        "test_script_entry.py::test_ctrl_c_while_a_program_of_ours_loads_is_one_line_and_exit_130_and_later_the_usual_path",
        "test_gpu_kernels_script.py::test_on_cpu_the_kernel_model_matches_and_real_flash_beats_the_paper_baseline",
        "test_gpu_kernels_script.py::test_workers_give_the_rows_of_the_serial_run_bit_for_bit_in_grid_order",
        "test_gpu_kernels_script.py::test_the_inputs_regenerate_alike_under_avx2_and_avx512_dispatch",
        "test_bench_triton_script.py::test_the_cpu_rehearsal_times_triton_and_sdpa_flash_and_writes_the_report",
        "test_gemm.py::test_gemm_k_figure_end_to_end",
        "test_gemm.py::test_gemm_formats_figure_end_to_end",
        "test_gemm.py::test_gemm_scaling_figure_end_to_end",
        "test_gemm_figures.py::test_gemm_scaling_orders_formats_of_equal_mantissa_bits_the_same_in_every_process",
        "test_launchers.py::test_a_sweep_runs_its_jobs_in_parallel_with_the_parallel_launcher_and_leaves_no_process_behind",
        "test_launchers.py::test_a_sweep_runs_with_the_slurm_local_launcher",
        "test_optimizations.py::test_the_smoke_catalogue_writes_the_table_and_the_report_shows_it",
        "test_quiet.py::test_a_bench_sweep_in_parallel_says_only_what_numdev_means_and_each_job_logs_its_story",
        "test_readme_commands.py::test_the_command_runs_as_printed",
        "test_readme_commands.py::test_from_an_environment_without_the_scripts_commands_fall_back_to_python_m",
        "test_reconcile.py::test_reconcile_experiment_runs_through_the_command_line",
        "test_reconcile.py::test_fp8_causal_bench_command_gives_finite_outputs",
        "test_report.py::test_bench_records_carry_provenance_and_the_sweep_says_what_next",
        "test_report.py::test_the_report_of_a_study_has_its_marked_sections",
        "test_report.py::test_headless_chromium_shows_the_marked_sections",
        "test_sibling.py::test_numdev_compare_cli_writes_csv_and_figure",
        "test_sibling.py::test_the_callback_waits_for_a_snapshot_written_later_by_another_process",
        "test_study.py::test_the_smoke_study_runs_every_role_twice_and_writes_intervals",
        "test_harm.py::test_the_smoke_harm_study_runs_end_to_end_and_reads_back",
        "test_study.py::test_the_study_says_only_what_numdev_means_and_each_role_logs_its_story",
        "test_study.py::test_the_controls_start_where_they_should",
        "test_study.py::test_the_analysis_falls_back_to_snapshots_and_agrees",
        "test_study.py::test_the_report_shows_verdicts_loss_curves_samples_and_the_terminals_scores",
        "test_study.py::test_the_report_renders_in_a_real_browser",
        "test_study.py::test_a_study_missing_a_job_is_refused_by_name_and_analysed_with_partial",
    ),
}
_ORDER = {"faults": 0, "cli": 1, "unit": 2}  # the longest first: two workers finish together


def tier_of(module: str, function: str) -> str:
    for tier, entries in TIERS.items():
        if module in entries or f"{module}::{function}" in entries:
            return tier
    return "unit"


def _shared_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module- or session-scoped fixture of its own module (a trained run,
    a study, a SLURM cluster): its module's tests then run on one worker, which builds it once."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        for fixturedef in defs:
            if fixturedef.scope in ("module", "session", "package") and fixturedef.baseid.endswith(item.path.name):
                return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist reads xdist_group (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    shared = set()  # modules with a fixture of their own that their tests share
    for item in items:
        tier = tier_of(item.path.name, getattr(item, "originalname", item.name))
        item.add_marker(getattr(pytest.mark, tier))
        item.stash[_TIER] = tier
        if _shared_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.name))
            shared.add(item.path)
    # The longest tier first; a module that shares a fixture stays in one piece, at its longest test's
    # tier: pytest tears a module's fixture down when the next test is another module's, and a module
    # cut in two by the sort built its runs twice (test_function_level: 2 x 25 s).
    first = {}
    for item in items:
        if item.path in shared:
            first[item.path] = min(first.get(item.path, 9), _ORDER[item.stash[_TIER]])
    items.sort(key=lambda item: first.get(item.path, _ORDER[item.stash[_TIER]]))  # stable: within a tier, the files' order


_TIER = pytest.StashKey[str]()


class GroupCheck:
    """Under --dist loadgroup, a grouped test's node id ends in @<group> once xdist's worker has read the
    mark. Where it does not (pytest 9.2 with pytest-xdist 3.8: pytest-xdist#1386), the groups are silently
    ignored and each worker builds every shared run again: the default run takes minutes longer. Said in
    the summary instead (registered in pytest_configure: a conftest hook must be named pytest_*, and this one
    must run after the other)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
            return
        lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if lost:  # a warning: xdist shows a worker's warnings in the summary (an error here is an INTERNALERROR without it)
            warnings.warn(pytest.PytestConfigWarning(
                f"pytest {pytest.__version__} with pytest-xdist: --dist loadgroup ignored the group of {len(lost)} tests "
                f"({lost[0]} ...; pytest-xdist#1386), so shared runs are built on every worker: pip install -e '.[dev]' "
                "(it pins pytest<9.2)"), stacklevel=1)


# -- threads ------------------------------------------------------------------------------------------
def _test_threads(workers: int) -> int:
    """Torch threads per test process: NUMDEV_TEST_THREADS, else the cores shared among xdist's workers."""
    given = os.environ.get("NUMDEV_TEST_THREADS", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise pytest.UsageError(f"NUMDEV_TEST_THREADS={given!r} must be a positive integer (torch threads per test process), "
                                    "e.g. NUMDEV_TEST_THREADS=1, or unset for the cores shared among the workers")
        return int(given)
    return max(1, (os.cpu_count() or 1) // max(1, workers))


THREADS = 1  # set once the session starts (pytest_configure), from NUMDEV_TEST_THREADS or the workers


def _check_marker_expression(config) -> None:
    """`-m` names only registered markers: a typo (`-m unti`) would select nothing and exit 5 unexplained."""
    expression = config.option.markexpr or ""
    known = {line.split(":")[0].strip() for line in config.getini("markers")} | {"parametrize", "skip", "skipif", "xfail",
                                                                                 "usefixtures", "filterwarnings", "timeout", "xdist_group"}
    unknown = sorted(set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expression)) - known - {"and", "or", "not"})
    if unknown:
        raise pytest.UsageError(f"-m {expression!r}: no marker named {', '.join(unknown)}; the tiers are unit, cli, faults "
                                "(and slow, gpu: pyproject.toml's markers)")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    global THREADS
    _check_marker_expression(config)
    # SIGTERM (a CI runner's stop, `kill`) ends the run as Ctrl-C does: fixtures tear down and the commands
    # tests started are stopped (tests/helpers.py's die_with_parent covers a run killed outright)
    signal.signal(signal.SIGTERM, _interrupt)
    config.pluginmanager.register(GroupCheck(), "numdev-group-check")
    THREADS = _test_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))  # set in xdist's workers
    # Inherited by every process a test starts (torch's default thread count follows OMP_NUM_THREADS).
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    torch.set_num_threads(THREADS)
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):  # hypothesis keeps its files in the working directory: not in the repository
        try:
            from hypothesis.configuration import set_hypothesis_home_dir

            set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "numdev-tests-hypothesis")
        except ImportError:
            pass


@pytest.fixture(autouse=True)
def _deterministic_threads():
    """Every test starts, and leaves, with the session's thread count and seed 0 (a run with threads=2
    sets torch's threads for the whole process)."""
    torch.manual_seed(0)
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(THREADS)


def _pytests(handler: logging.Handler) -> bool:
    """pytest's own capturing handlers: pytest adds and removes them around each phase."""
    return type(handler).__module__.startswith("_pytest")


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """An in-process Hydra run with hydra/job_logging=disabled (Hydra's own config: disable_existing_loggers)
    disables every logger that exists, and an in-process argparse command (numdev.cli.logs.console) puts
    its own handlers on the root logger, bound to this test's captured streams: later tests in the same
    worker would see nothing, or write to closed streams. Both are put back after each test."""
    root = logging.getLogger()
    before, level = [h for h in root.handlers if not _pytests(h)], root.level
    yield
    now = root.handlers[:]
    root.handlers[:] = [h for h in now if _pytests(h) or h in before] + [h for h in before if h not in now]
    root.setLevel(level)
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.disabled = False


# -- a unit test stays in-process --------------------------------------------------------------------
def _starts_a_command(args) -> bool:
    """A numdev console script, `python -m numdev...`, `python -c ...`, a script of this repository or any `python X.py`
    (not the processes libraries start for themselves: a C compiler, torch.compile's workers, git)."""
    words = [str(w) for w in (args if isinstance(args, (list, tuple)) else [args])]
    if not words:
        return False
    if Path(words[0]).name.startswith("numdev-"):
        return True
    if words[0] != sys.executable or len(words) < 2:
        return False
    return (words[1] == "-c" or (words[1] == "-m" and words[2:3] and words[2].startswith("numdev"))
            or words[1].startswith(str(REPO)) or words[1].endswith(".py"))


@pytest.fixture(autouse=True)
def _unit_tests_stay_in_process(request, monkeypatch):
    """`-m unit` must mean in-process: a unit test that starts a numdev command or a Python process fails,
    naming the line to add to TIERS."""
    if request.node.stash.get(_TIER, "unit") != "unit":
        yield
        return
    started = []
    real = subprocess.Popen.__init__

    def init(self, args, *rest, **kwargs):
        if _starts_a_command(args):
            started.append(" ".join(str(w) for w in (args if isinstance(args, (list, tuple)) else [args]))[:200])
        real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield
    if started:
        node = request.node
        pytest.fail(f"a unit test started {started[0]!r}: add \"{node.path.name}::{getattr(node, 'originalname', node.name)}\" "
                    "to TIERS['cli'] (or 'faults') in tests/conftest.py", pytrace=False)


# -- the suite leaves the repository as it found it ---------------------------------------------------
_CACHES = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}


def repo_files(root: Path = REPO) -> set[str]:
    """Every path under the repository, caches and the venv aside."""
    found = set()
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _CACHES and not d.endswith(".egg-info")]
        base = Path(directory).relative_to(root)
        found.update(str(base / name) for name in [*dirs, *files])
    return found


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        session.config.stash[_BEFORE] = repo_files()


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    new = sorted(repo_files() - before)
    session.config.stash[_NEW] = new
    if new and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set]()
_NEW = pytest.StashKey[list]()


def _machine_lines(config) -> list[str]:
    """What the run's numbers depend on: the CPU and its vector/matrix extensions, the kernels torch
    dispatches to (its CPU capability) and the BLAS."""
    from numdev.runs.provenance import cpu_flags_of_interest, cpu_model

    blas = next((line.strip(" -") for line in torch.__config__.show().splitlines() if "Math Kernel Library" in line
                 or "OpenBLAS" in line), "BLAS unknown")
    workers = getattr(config.option, "numprocesses", None) if getattr(config.option, "dist", "no") != "no" else None
    threads = _test_threads(workers or 1)
    return [f"cpu: {cpu_model()}, {os.cpu_count()} logical CPU(s); flags: {' '.join(cpu_flags_of_interest()) or 'none of interest'}",
            f"torch {torch.__version__}: CPU capability {torch.backends.cpu.get_cpu_capability()}, {threads} "
            f"thread(s) per test process{f' ({workers} workers)' if workers else ''}; {blas}"]


def pytest_terminal_summary(terminalreporter, config):
    """The machine, at the end of every test run (also under -q, which hides pytest's header); and
    any file the tests left in the repository (they write under their tmp_path only)."""
    new = config.stash.get(_NEW, [])
    if new:
        terminalreporter.section("files left in the repository", red=True)
        terminalreporter.write_line(f"the tests created {len(new)} path(s) under {REPO} (write under tmp_path instead):")
        for path in new[:50]:
            terminalreporter.write_line(f"  {path}")
    terminalreporter.section("machine")
    for line in _machine_lines(config):
        terminalreporter.write_line(line)


@pytest.fixture
def train_config():
    """compose_train(*overrides, run_dir=None): the numdev-train config with the smoke settings."""
    return compose_train
