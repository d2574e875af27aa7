"""A real single-node SLURM cluster on this machine, for the tests: munged, slurmctld and slurmd from
Debian's packages (slurm-wlm, munge; `.ci/run` installs them), each started in the foreground with
its own key, socket, ports, spool and state directories under a temporary folder, and stopped at the
end. Commands reach it through SLURM_CONF, which every child process (sbatch from submitit, srun
inside the job) inherits.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from helpers import free_port

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue")


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _node_line() -> str:
    """This machine as slurmd sees it (`slurmd -C`): CPUs and memory must not exceed what it has."""
    first = subprocess.run([_program("slurmd"), "-C"], capture_output=True, text=True, timeout=60, check=True).stdout
    return first.splitlines()[0]


class Cluster:
    """munged + slurmctld + slurmd under `root`; `env` is the environment that reaches it."""

    def __init__(self, root: Path):
        self.root = root
        self.processes: list[subprocess.Popen] = []
        node = _node_line()
        self.node = node.split()[0].split("=", 1)[1]
        for d in ("state", "spool", "munge"):
            (root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "munge", 0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = root / "munge" / "munge.socket"
        self.conf = root / "slurm.conf"
        self.conf.write_text("\n".join([
            "ClusterName=numdev-test",
            f"SlurmctldHost={self.node}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: a requeued job waits this long before it starts again (default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",
            "MinJobAge=300",
            "InactiveLimit=0",
            "KillWait=5",
            f"{node} State=UNKNOWN",
            f"PartitionName=cpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 120) -> None:
        munge = self.root / "munge"
        self._spawn([_program("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                     f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged's socket", timeout_s)
        self._spawn([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn([_program("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._node_idle, f"node {self.node} idle in sinfo", timeout_s)

    def _spawn(self, command: list[str]) -> None:
        log = open(self.root / (Path(command[0]).name + ".out"), "wb")  # noqa: SIM115 (closed with the process)
        # Working in the cluster's own folder: whatever a daemon writes beside it stays there.
        self.processes.append(subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                               start_new_session=True))

    def _node_idle(self) -> bool:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args[0]} exited ({process.returncode}): {self.logs()}")
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30)
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def _wait(self, ready, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM test cluster: no {what} after {timeout_s:g} s: {self.logs()}")
            time.sleep(0.2)

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), env=self.env, capture_output=True, text=True, timeout=60, check=check)

    def jobs(self) -> list[tuple[str, str]]:
        """(job id, state) of every job slurmctld still knows."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i %T").stdout
        return [tuple(line.split()) for line in out.splitlines() if line.strip()]

    def logs(self) -> str:
        tails = []
        for name in ("slurmctld.log", "slurmd.log", "munged.out", "slurmctld.out", "slurmd.out"):
            path = self.root / name if not name.startswith("munged") else self.root / name
            if path.exists():
                tails.append(f"--- {name}: " + path.read_text(errors="replace")[-1500:])
        return "\n".join(tails)

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (their whole sessions), last started first."""
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True, timeout=30)
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
