"""A throwaway single-node SLURM cluster for the tests: Debian's `slurm-wlm` and `munge`, started by
the test itself (munged, slurmctld and slurmd in the foreground, on a slurm.conf, ports, key and
state folders of its own in a temporary folder) and stopped by pid. Commands reach it through
`$SLURM_CONF`, which `env()` sets; nothing under /etc is read or written.

No cgroups: processes are tracked by their parent (proctrack/linuxproc) and not bound to cores
(task/none), which a container allows. The node has this machine's cores and no GPU, so a job asks
for `--gpus-per-task=0`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ports import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol")
SKIP = "slurm-wlm and munge are not installed (make test installs them: apt-get install slurm-wlm munge)"


def installed() -> bool:
    return all(shutil.which(name) or Path(f"/usr/sbin/{name}").exists() for name in DAEMONS)


@dataclass
class Cluster:
    folder: Path
    conf: Path
    node: str

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment with the cluster's configuration, less any SLURM task's."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**base, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(list(command), env=self.env(), capture_output=True, text=True, timeout=60, **kwargs)
        if check and done.returncode:
            pytest.fail(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}\n{self.logs()}")
        return done

    def sbatch(self, *args: str, env: dict[str, str], cwd: Path) -> str:
        """Submit; the job id."""
        done = subprocess.run(["sbatch", "--parsable", *args], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=60)
        if done.returncode:
            pytest.fail(f"sbatch failed: {done.stderr}\n{self.logs()}")
        return done.stdout.strip().split(";")[0]

    def jobs(self, job: str) -> dict[str, str]:
        """Each task of an array job still known to the controller ('JOB_TASK') and its state."""
        done = self.run("squeue", "--array", "--noheader", "--jobs", job, "--format", "%i %T", check=False)
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.folder.glob("*.log")))


def _conf(folder: Path, node: str, ctld: int, slurmd: int) -> str:
    cores = os.cpu_count() or 1
    memory = 4000
    return "\n".join([
        "ClusterName=ablatetest", f"SlurmctldHost={node}(127.0.0.1)", f"SlurmctldPort={ctld}",
        f"SlurmdPort={slurmd}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        # cred_expire: a requeued job waits this long (+1 s) before it starts again (default 120 s)
        f"AuthInfo=cred_expire=10,socket={folder / 'munge.socket'}", "CredType=cred/munge",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none", "ReturnToService=2", "JobRequeue=1", "KillWait=20",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cores} RealMemory={memory} State=UNKNOWN",
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


def start_cluster(folder: Path) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd in `folder`; yield the cluster once its node is idle; stop
    every job, then the daemons (by pid)."""
    if not installed():
        pytest.skip(SKIP)
    if os.geteuid() != 0:
        pytest.skip("the test SLURM cluster runs its daemons as root")
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True)
    node = socket.gethostname().split(".")[0]
    key = folder / "munge.key"
    subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True, timeout=30)
    daemons: list[subprocess.Popen] = []
    cluster = Cluster(folder, folder / "slurm.conf", node)
    try:
        daemons.append(subprocess.Popen(
            ["munged", "-F", "-f", f"--socket={folder / 'munge.socket'}", f"--key-file={key}",
             f"--log-file={folder / 'munged.log'}", f"--pid-file={folder / 'munged.pid'}",
             f"--seed-file={folder / 'munged.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while not (folder / "munge.socket").exists():
            if time.monotonic() > deadline or daemons[0].poll() is not None:
                pytest.fail(f"munged did not start\n{cluster.logs()}")
            time.sleep(0.1)
        cluster.conf.write_text(_conf(folder, node, free_port(), free_port()))
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", node]):
            daemons.append(subprocess.Popen([*daemon, "-f", str(cluster.conf)], env=cluster.env(),
                                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while "idle" not in cluster.run("sinfo", "--noheader", "--format", "%T", check=False).stdout:
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                pytest.fail(f"the test SLURM cluster did not come up\n{cluster.logs()}")
            time.sleep(0.5)
        yield cluster
    finally:
        if cluster.conf.exists():
            subprocess.run(["scancel", "--full", "--quiet", "--user", "root"], env=cluster.env(), timeout=60,
                           capture_output=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "--noheader"], env=cluster.env(), capture_output=True, text=True,
                    timeout=60).stdout.strip():
                time.sleep(0.5)
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
