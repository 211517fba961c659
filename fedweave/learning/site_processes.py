"""One site's local training across several processes (``--nproc-per-node N``): the side of
the process that asks for it (a site's ClientApp worker, a gossip peer).

The first training starts a group of ``N`` rank processes (``fedweave.learning.training_rank``)
that read the site's task and data themselves, as ``torchrun`` would start them; they join a
``torch.distributed`` group (NCCL on GPUs, one GPU a process; gloo on CPU) through a file in
a private folder, never a network rendezvous, and gloo listens on loopback only. The group
stays for the rounds that follow: each round's job (the start weights in the folder, the
round's settings as one JSON line on every rank's stdin) has every rank train its part of
every batch with the model in ``DistributedDataParallel`` (``TrainConfig.rank``/
``world_size``), so the update is the one a single process makes with the same global
batch. Rank 0 writes the update and the metrics; each rank then says ``done`` on its stdout,
and this process reads the update back into the site's model.

A rank that fails ends the job and the group: the first to fail names the reason (its
exception, or the signal that killed it); one that stops making progress (stopped, hung) is
named once the others give up waiting for it, after ``stall_seconds`` without a step. Every
rank is killed before the failure is raised, and the next round starts a new group. The
ranks die with this process (``PR_SET_PDEATHSIG``), and with its exit (``atexit``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fedweave.contract import PROCESSES_METRIC, one_line

STALL_SECONDS = 300.0
"""A rank with no training step for this long has stalled: the others' collectives time out
and the job ends (a step of a large model on a slow GPU stays well under it)."""
START_SECONDS = 600.0
"""How long a job may take before any rank begins training (a new group starts Python, torch,
CUDA and reads the site's data first)."""
POLL_SECONDS = 0.05
"""How often the job's processes are looked at while they train."""
FAILURE_GRACE_SECONDS = 2.0
"""After a rank fails, how long the others have to fail in turn (a closed connection reaches
them in milliseconds) before one still running counts as the one they waited for."""
RANK_MODULE = "fedweave.learning.training_rank"
JOB_PREFIX = "fedweave-ranks-"
"""A group's private folder in the temporary directory: this prefix, the pid of the process
that started it, a dash and a random part."""
DONE_PREFIX = "fedweave-rank done "
"""Before a job's number on a rank's stdout: it finished that job (rank 0: its update and
metrics are written)."""


class SiteProcessesFailed(Exception):
    """A rank of a site's training failed or stalled; the message says which and why."""


@dataclass(frozen=True)
class SiteData:
    """What a rank reads to train on: the site's data as the site itself reads it.

    Attributes:
        task: the task's spec (``fedweave.learning.tasks.load_task``).
        path: the site's data file or folder (``--data``).
        label_column: a CSV file's label column (default ``None``).
        columns: the column map's path (``--columns``; default ``None``).
        eval_path: the site's evaluation file (``--eval-data``): when given, the whole of
            ``path`` trains (default ``None``).
        eval_fraction: else the share of ``path`` held out to evaluate (default 0.1).
    """

    task: str
    path: str
    label_column: str | None = None
    columns: str | None = None
    eval_path: str | None = None
    eval_fraction: float = 0.1


@dataclass(frozen=True)
class SiteProcesses:
    """How a site trains across processes.

    Attributes:
        nproc: processes a round's training runs in (``--nproc-per-node``), at least 2 here.
        data: what they read (``SiteData``).
        device: ``cuda`` (rank ``r`` on GPU ``r``), ``cpu``, or ``None`` for CUDA when
            present.
        stall_seconds: a rank without a step this long has stalled (``STALL_SECONDS``).
    """

    nproc: int
    data: SiteData
    device: str | None = None
    stall_seconds: float = STALL_SECONDS


def processes_problem(nproc: int, device: str | None, task: Any) -> str | None:
    """Why a site cannot train across ``nproc`` processes on ``device`` with ``task``, in one
    line naming the fix; None when it can (or ``nproc`` is 1)."""
    if nproc < 1:
        return f"--nproc-per-node {nproc}: give at least 1 (one process per GPU, or per core)"
    if nproc == 1:
        return None
    import torch

    if not torch.distributed.is_available():
        return (
            f"--nproc-per-node {nproc}: this torch build has no torch.distributed; "
            "install a build with it or use --nproc-per-node 1"
        )
    wants_cuda = (device or "auto").startswith("cuda") or (
        device in (None, "auto") and torch.cuda.is_available()
    )
    if wants_cuda:
        if not torch.cuda.is_available():
            return f"--device {device}: no CUDA GPU is visible; use --device cpu"
        if device not in (None, "auto", "cuda"):
            return (
                f"--nproc-per-node {nproc} puts rank r on GPU r, so --device {device} names "
                "none; use --device cuda and choose the GPUs with CUDA_VISIBLE_DEVICES"
            )
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            return (
                f"--nproc-per-node {nproc} needs one GPU a process, but {gpus} "
                f"GPU{'s are' if gpus != 1 else ' is'} visible; use --nproc-per-node {gpus} "
                "or fewer"
            )
        if not torch.distributed.is_nccl_available():
            return (
                f"--nproc-per-node {nproc} on GPUs needs NCCL, which this torch build lacks; "
                "install a CUDA build of torch with NCCL, or use --device cpu"
            )
    else:
        cores = len(os.sched_getaffinity(0))
        if nproc > cores:
            return (
                f"--nproc-per-node {nproc} on CPU needs a core a process, but this machine "
                f"gives {cores}; use --nproc-per-node {cores} or fewer"
            )
        if not torch.distributed.is_gloo_available():
            return (
                f"--nproc-per-node {nproc} on CPU needs gloo, which this torch build lacks; "
                "use --nproc-per-node 1"
            )
    if not getattr(task, "trains_across_processes", False):
        name = getattr(task, "name", task)
        return (
            f"task '{name}' trains in its own loop, which fedweave cannot split across "
            "processes; use --nproc-per-node 1, or have its train() hand its config to "
            "fedweave.learning.train_epochs and declare trains_across_processes = True"
        )
    return None


def check_processes(nproc: int, device: str | None, task: Any) -> None:
    """``processes_problem``'s refusal, and ``device``'s own, as a one-line ``UserError``."""
    from fedweave.errors import UserError
    from fedweave.learning.training import pick_device

    pick_device(device)
    problem = processes_problem(nproc, device, task)
    if problem is not None:
        raise UserError(problem)


def train_across_processes(
    processes: SiteProcesses,
    model: Any,
    config: Any,
    statistics: str | None = None,
) -> dict[str, float]:
    """Train ``model`` in place as ``processes.nproc`` ranks would with ``config`` (a
    ``TrainConfig``; ``statistics``: the run's federated statistics the task prepares the
    data with), in the site's group (started on first use). Returns the metrics
    ``train_epochs`` returns, plus ``PROCESSES_METRIC``.

    Raises ``SiteProcessesFailed`` when a rank fails or stalls; the group is gone by then
    (its ranks killed), and the next call starts a new one.
    """
    group = _GROUPS.get(processes)
    if group is None:
        group = _GROUPS[processes] = _RankGroup(processes)
    try:
        metrics = group.run(model, config, statistics)
    except BaseException:  # a failure, or Ctrl-C mid-job: no rank outlives its job's end
        _GROUPS.pop(processes, None)
        group.close()
        raise
    metrics[PROCESSES_METRIC] = float(processes.nproc)
    return metrics


def close_site_processes() -> None:
    """Stop every group this process started (their ranks killed, folders removed)."""
    while _GROUPS:
        _GROUPS.popitem()[1].close()


_GROUPS: dict[SiteProcesses, _RankGroup] = {}
atexit.register(close_site_processes)


class _RankGroup:
    """``processes.nproc`` ranks kept between jobs, in a private folder of their own."""

    def __init__(self, processes: SiteProcesses) -> None:
        _sweep_orphaned_groups()
        self.processes = processes
        self.folder = Path(tempfile.mkdtemp(prefix=f"{JOB_PREFIX}{os.getpid()}-"))  # 0700
        group = {
            "data": asdict(processes.data), "device": processes.device,
            "stall_seconds": processes.stall_seconds,
        }  # fmt: skip
        (self.folder / "group.json").write_text(json.dumps(group))
        self.jobs = 0
        self.done = [0] * processes.nproc  # the last job each rank said it finished
        self.exits: dict[int, float] = {}  # rank -> when it exited (the monotonic clock)
        self.ranks = [self._start(rank) for rank in range(processes.nproc)]

    def _start(self, rank: int) -> subprocess.Popen:
        """Rank ``rank`` in its own session; its stderr is ours (a site's log), its stdout
        read here for what it finished. It ties its life to ours itself, first thing
        (``training_rank``: no ``preexec_fn`` in a process with threads)."""
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        command = [
            sys.executable, "-m", RANK_MODULE, str(self.folder), str(rank),
            str(self.processes.nproc), str(os.getpid()),
        ]  # fmt: skip
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
            errors="replace", start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._follow, args=(rank, proc), name=f"rank-{rank}",
                         daemon=True).start()  # fmt: skip
        return proc

    def _follow(self, rank: int, proc: subprocess.Popen) -> None:
        """Note each job ``rank`` finishes; pass the rest of its stdout on to our stderr;
        note when it exits."""
        with proc.stdout:  # type: ignore[union-attr]
            for line in proc.stdout:  # type: ignore[union-attr]
                number = line[len(DONE_PREFIX) :].strip()
                if line.startswith(DONE_PREFIX) and number.isdigit():
                    self.done[rank] = int(number)
                else:
                    sys.stderr.write(line)
        proc.wait()
        self.exits[rank] = time.monotonic()

    def run(self, model: Any, config: Any, statistics: str | None) -> dict[str, float]:
        """One job: ``model``'s weights out, every rank told, the update read back in."""
        import numpy as np

        from fedweave.learning.weights import get_weights, load_weights_npz, set_weights

        self.jobs += 1
        job = self.folder / f"job-{self.jobs}"
        job.mkdir()
        try:
            np.savez(job / "start.npz", *get_weights(model))  # a hand-over: no fsync, no hash
            line = json.dumps({
                "job": self.jobs, "statistics": statistics,
                "config": asdict(replace(config, world_size=self.processes.nproc, device=None)),
            })  # fmt: skip
            started = time.monotonic()
            for proc in self.ranks:
                try:
                    proc.stdin.write(line + "\n")  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
                except OSError:  # it died since the last job: the wait names it
                    pass
            self._wait(started)
            metrics = json.loads((job / "metrics.json").read_text())
            set_weights(model, load_weights_npz(job / "update.npz"))
            return metrics
        finally:
            shutil.rmtree(job, ignore_errors=True)

    def _wait(self, started: float) -> None:
        """Until every rank has finished this job; else raise with the rank that failed
        first (its own failure; the others' follow from it) or the one the others gave up
        waiting for."""
        world, stall = len(self.ranks), self.processes.stall_seconds
        while True:
            if all(done == self.jobs for done in self.done):
                return
            if any(proc.poll() is not None for proc in self.ranks):
                raise SiteProcessesFailed(self._failure(started))
            steps = [self._last_step(rank, started) for rank in range(world)]
            if max(steps) == started and time.monotonic() - started > START_SECONDS:
                raise SiteProcessesFailed(
                    f"the site's {world} training processes had not begun the round's training "
                    f"after {START_SECONDS:g} s; see the site's log"
                )
            if (
                max(steps) > started
                and time.monotonic() - max(steps) > stall + FAILURE_GRACE_SECONDS
            ):
                stalled = min(range(world), key=lambda rank: steps[rank])
                raise SiteProcessesFailed(
                    f"rank {stalled} of {world} made no progress for {stall:g} s; the site's "
                    "training processes were stopped"
                )
            time.sleep(POLL_SECONDS)

    def _failure(self, started: float) -> str:
        """The reason of a job one of whose ranks exited: once the others have had
        ``FAILURE_GRACE_SECONDS`` to fail after it, a rank still running is the one they
        gave up waiting for (stopped, or stuck outside training), unless a rank was killed
        from outside; else a rank killed by a signal (the others only fail for want of it),
        one killed from outside before one that aborted itself (a rank whose peer vanished
        may abort first), else the first to say it failed."""
        ranks, world = self.ranks, len(self.ranks)
        deadline = time.monotonic() + FAILURE_GRACE_SECONDS
        while time.monotonic() < deadline and any(proc.poll() is None for proc in ranks):
            time.sleep(POLL_SECONDS)
        said = {rank: self._said(rank) for rank in range(world)}
        failed = [rank for rank, proc in enumerate(ranks) if proc.poll() is not None]
        killed = [rank for rank in failed if (ranks[rank].returncode or 0) < 0]
        from_outside = [rank for rank in killed if ranks[rank].returncode != -signal.SIGABRT]
        when = {
            rank: said[rank]["at"] if said[rank] is not None
            else self.exits.get(rank, time.monotonic())
            for rank in failed
        }  # fmt: skip
        first = min(from_outside or killed or failed, key=lambda rank: when[rank])
        seconds = max(0.0, when[first] - started)
        alive = [rank for rank, proc in enumerate(ranks) if proc.poll() is None]
        if alive and not from_outside:  # a rank killed from outside is the cause, whatever
            # the others were still waiting on when the grace ran out (a loaded machine)
            steps = {rank: self._last_step(rank, started) for rank in alive}
            stalled = min(alive, key=lambda rank: steps[rank])
            return (
                f"rank {stalled} of {world} stopped answering; rank {first} gave up waiting "
                f"for it after {seconds:.1f} s"
            )
        code = ranks[first].returncode
        if code is not None and code < 0:
            killer = signal.Signals(-code).name
            return f"rank {first} of {world} was killed by {killer} after {seconds:.1f} s"
        if said[first] is not None:
            return f"rank {first} of {world} failed after {seconds:.1f} s: {said[first]['reason']}"
        return f"rank {first} of {world} exited with code {code} after {seconds:.1f} s; see the log"

    def _said(self, rank: int) -> dict | None:
        """What a failed rank wrote of its failure (``training_rank``): its reason and when
        (the monotonic clock), or None."""
        try:
            said = json.loads((self.folder / f"rank-{rank}.error").read_text())
            return {"reason": one_line(str(said["reason"])), "at": float(said["at"])}
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _last_step(self, rank: int, started: float) -> float:
        """When ``rank`` last began a training step (the monotonic clock), ``started`` if not
        since then."""
        try:
            age = time.time() - (self.folder / f"rank-{rank}.steps").stat().st_mtime
        except OSError:
            return started
        return max(started, time.monotonic() - age)

    def close(self) -> None:
        """Kill every rank and remove the folder."""
        for proc in self.ranks:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.ranks:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except OSError:  # what it had not read yet: nobody reads it now
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def _sweep_orphaned_groups() -> None:
    """Remove the folders of groups whose process died without removing them (killed with
    their ranks): each may hold a copy of the model."""
    for folder in Path(tempfile.gettempdir()).glob(f"{JOB_PREFIX}*-*"):
        pid = folder.name[len(JOB_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or folder.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:  # another user's process with that pid: not ours to judge
            continue
