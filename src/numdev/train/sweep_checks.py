"""A sweep's jobs checked against each other before any of them runs (numdev-train's preflight,
numdev.config.preflight.sweep_problem): a sibling reference no job makes, one made after the job that
waits for it, a claim against a role the study lacks. Imports no torch: the answer comes in about a second."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

from numdev.runs.layout import RUN_RECORD


def check_sweep(jobs) -> str | None:
    """A sweep's jobs against each other, before it starts (numdev.config.preflight.SweepJob each; a single
    run is a one-job sweep whose reference must exist, since nothing will make it): a job
    whose sibling.reference is no job of the sweep and does not exist would wait sibling.timeout_s
    (an hour) for a run that never comes (`study=truth,flash` without the reference); one whose
    reference the sweep runs after it, one job at a time, would wait the same. One line naming the
    role and the reference, or None."""
    made = {job.run_dir: job for job in jobs}
    for job in jobs:
        try:
            reference = OmegaConf.select(job.cfg, "sibling.reference", throw_on_resolution_failure=True)
        except Exception:  # noqa: BLE001 - resolved only as the run starts: its own check then
            continue
        if reference is None:
            continue
        path = os.path.normpath(str(reference))
        role = OmegaConf.select(job.cfg, "study.role", default=None)
        who = f"sweep job #{job.num} (" + (f"role {role}, replicate {OmegaConf.select(job.cfg, 'study.replicate', default='?')}"
                                          if role is not None else " ".join(job.swept)) + ")"
        shown = os.path.relpath(path, job.sweep_dir) if job.sweep_dir and path.startswith(job.sweep_dir + os.sep) else path
        timeout = OmegaConf.select(job.cfg, "sibling.timeout_s", default=None)
        maker = made.get(path)
        if job.sweep_dir is None and not os.path.exists(path):  # a single run: nothing is going to make it
            parent = "" if os.path.isdir(os.path.dirname(path) or ".") else " (nor does its parent directory)"
            return (f"sibling.reference={path} does not exist{parent}: give the directory of a numdev-train run "
                    "(start the reference first; a study's roles run in one sweep)")
        if maker is None and os.path.exists(path) and not os.path.isdir(path):
            return (f"{who if job.sweep_dir else 'this run'} compares with sibling.reference={path}, which is a file, not a "
                    "run directory: give the directory of a numdev-train run (of a sweep: one of its runs, e.g. .../r0/reference)")
        if maker is None and os.path.isdir(path) and not _is_a_run(path):
            return (f"{who if job.sweep_dir else 'this run'} compares with sibling.reference={path}, which is not a numdev-train "
                    "run (no run.json, and no process holds its run lock), so no snapshot would come: give the directory of "
                    "a run (of a sweep: one of its runs, e.g. .../r0/reference)")
        if maker is None and not os.path.exists(path):
            return (f"{who} compares with sibling.reference {shown}, which no job of the sweep makes and which does not exist "
                    f"({path}): it would wait {timeout} s (sibling.timeout_s) for it; add the role that makes it to the sweep "
                    "(e.g. study=truth,reference,...) or point sibling.reference at an existing run; no job was run")
        if maker is not None and maker.num > job.num and job.one_at_a_time:
            return (f"{who} compares with {shown}, which the sweep runs after it, one job at a time: it would wait {timeout} s "
                    "(sibling.timeout_s) for it; list the reference's role first (study=truth,reference,...) or run jobs in "
                    "parallel (hydra.launcher.n_jobs=2); no job was run")
    return _claim_problem(jobs)


def _claim_problem(jobs) -> str | None:
    """A role's study.claim_than names a role of the sweep, or one with a run in the study's directory
    (a study extended later): otherwise the claim could never be judged, and the study would find
    that out only at its analysis."""
    roles = {OmegaConf.select(job.cfg, "study.role", default=None) for job in jobs}
    for job in jobs:
        than = OmegaConf.select(job.cfg, "study.claim_than", default=None)
        if than is None or than in roles:
            continue
        replicate = OmegaConf.select(job.cfg, "study.replicate", default=None)
        there = job.sweep_dir and os.path.isdir(os.path.join(job.sweep_dir, f"r{replicate}", str(than)))
        if not there:
            role = OmegaConf.select(job.cfg, "study.role", default="?")
            return (f"role {role}: study.claim_than={than!r} is no role of this sweep and has no run in "
                    f"{job.sweep_dir or 'the study'}: add it to the sweep (study=...,{than}) or name a role that is; no job was run")
    return None


def _is_a_run(path: str) -> bool:
    """A directory that holds a run record, or whose run lock a live process holds (a run starting up)."""
    from numdev.runs.lock import is_held

    return (Path(path) / RUN_RECORD).is_file() or is_held(path)
