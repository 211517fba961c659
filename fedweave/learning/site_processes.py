"""One site's local training across several processes (``--nproc-per-node N``): the side of
the process that asks for it (a site's ClientApp worker, a gossip peer).

For each round's training it starts ``N`` rank processes (``fedweave.learning.training_rank``)
that read the site's task and data themselves, as ``torchrun`` would start them; they join a
``torch.distributed`` group (NCCL on GPUs, one GPU a process; gloo on CPU) through a file in
a private folder, never a network rendezvous, and gloo listens on loopback only. Each trains
its part of every batch with the model in ``DistributedDataParallel``
(``TrainConfig.rank``/``world_size``), so the update is the one a single process makes with
the same global batch. Rank 0 writes the update and the metrics; this process reads them
back into the site's model.

A rank that fails ends the job: the first to fail names the reason (its exception, or the
signal that killed it); one that stops making progress (stopped, hung) ends it after
``stall_seconds``, named as the rank whose last step is oldest. Every rank is killed before
this returns or raises, and dies with this process if it dies (``PR_SET_PDEATHSIG``). Each
round starts a new group, so a failure never reaches the next round.
"""

from __future__ import annotations

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
POLL_SECONDS = 0.05
"""How often the job's processes are looked at while they train."""
FAILURE_GRACE_SECONDS = 2.0
"""After a rank fails, how long the others have to fail in turn (a closed connection reaches
them in milliseconds) before one still running counts as the one they waited for."""
RANK_MODULE = "fedweave.learning.training_rank"
JOB_PREFIX = "fedweave-ranks-"
"""A job's private folder in the temporary directory: this prefix, the pid of the process that
started it, a dash and a random part."""


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


def train_across_processes(
    processes: SiteProcesses,
    model: Any,
    config: Any,
    statistics: str | None = None,
) -> dict[str, float]:
    """Train ``model`` in place as ``processes.nproc`` ranks would with ``config`` (a
    ``TrainConfig``; ``statistics``: the run's federated statistics the task prepares the
    data with). Returns the metrics ``train_epochs`` returns, plus ``PROCESSES_METRIC``.

    Raises ``SiteProcessesFailed`` when a rank fails or stalls; every rank is gone by then.
    """
    from fedweave.learning.weights import get_weights, load_weights_npz, save_weights_npz

    _sweep_orphaned_jobs()
    job = Path(tempfile.mkdtemp(prefix=f"{JOB_PREFIX}{os.getpid()}-"))  # 0700: ours only
    ranks: list[subprocess.Popen] = []
    try:
        save_weights_npz(job / "start.npz", get_weights(model))
        spec = {
            "data": asdict(processes.data),
            "statistics": statistics,
            "config": asdict(replace(config, world_size=processes.nproc, device=None)),
            "device": processes.device,
            "stall_seconds": processes.stall_seconds,
        }
        (job / "job.json").write_text(json.dumps(spec))
        started = time.monotonic()
        ranks = [_start_rank(job, rank, processes.nproc) for rank in range(processes.nproc)]
        _wait(ranks, job, processes.stall_seconds, started)
        metrics = json.loads((job / "metrics.json").read_text())
        from fedweave.learning.weights import set_weights

        set_weights(model, load_weights_npz(job / "update.npz"))
        metrics[PROCESSES_METRIC] = float(processes.nproc)
        return metrics
    finally:
        for proc in ranks:
            _kill(proc)
        shutil.rmtree(job, ignore_errors=True)


def _sweep_orphaned_jobs() -> None:
    """Remove the job folders of processes that died without removing them (killed with
    their ranks mid-round): each holds a copy of the model."""
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


def _start_rank(job: Path, rank: int, world_size: int) -> subprocess.Popen:
    """Rank ``rank`` in its own session, writing to our stderr (a site's log); it ties its
    life to ours itself, first thing (``training_rank``: no ``preexec_fn`` in a process with
    threads)."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    command = [
        sys.executable, "-m", RANK_MODULE, str(job), str(rank), str(world_size), str(os.getpid())
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=2, env=env,  # both to our stderr
        start_new_session=True,
    )  # fmt: skip


def _wait(ranks: list[subprocess.Popen], job: Path, stall_seconds: float, started: float) -> None:
    """Until every rank exits 0; else raise with the rank that failed first (its own
    failure; the others' follow from it) or the one the others gave up waiting for."""
    exits: dict[int, float] = {}  # rank -> when it exited (the monotonic clock)

    def watch(rank: int) -> None:
        ranks[rank].wait()
        exits[rank] = time.monotonic()

    for rank in range(len(ranks)):
        threading.Thread(target=watch, args=(rank,), name=f"rank-{rank}", daemon=True).start()
    while True:
        codes = [proc.poll() for proc in ranks]
        if all(code == 0 for code in codes):
            return
        if any(code not in (None, 0) for code in codes):
            raise SiteProcessesFailed(_failure(ranks, job, exits, started))
        steps = [_last_step(job, rank, started) for rank in range(len(ranks))]
        if time.monotonic() - max(steps) > stall_seconds + FAILURE_GRACE_SECONDS:
            stalled = min(range(len(ranks)), key=lambda rank: steps[rank])
            raise SiteProcessesFailed(
                f"rank {stalled} of {len(ranks)} made no progress for {stall_seconds:g} s; "
                "the site's training processes were stopped"
            )
        time.sleep(POLL_SECONDS)


def _failure(
    ranks: list[subprocess.Popen], job: Path, exits: dict[int, float], started: float
) -> str:
    """The reason of a job one of whose ranks failed: once the others have had
    ``FAILURE_GRACE_SECONDS`` to fail after it, a rank still running is the one they gave up
    waiting for (stopped, or stuck outside training); else a rank killed by a signal (the
    others only fail for want of it), else the first to say it failed."""
    world = len(ranks)
    deadline = time.monotonic() + FAILURE_GRACE_SECONDS
    while time.monotonic() < deadline and any(proc.poll() is None for proc in ranks):
        time.sleep(POLL_SECONDS)
    said = {rank: _said(job, rank) for rank in range(world)}
    failed = [rank for rank, proc in enumerate(ranks) if proc.poll() not in (None, 0)]
    killed = [rank for rank in failed if (ranks[rank].returncode or 0) < 0]
    when = {
        rank: said[rank]["at"] if said[rank] is not None else exits.get(rank, time.monotonic())
        for rank in failed
    }  # fmt: skip
    first = min(killed or failed, key=lambda rank: when[rank])
    seconds = when[first] - started
    alive = [rank for rank, proc in enumerate(ranks) if proc.poll() is None]
    if alive:
        steps = {rank: _last_step(job, rank, started) for rank in alive}
        stalled = min(alive, key=lambda rank: steps[rank])
        return (
            f"rank {stalled} of {world} stopped answering; rank {first} gave up waiting for it "
            f"after {seconds:.1f} s"
        )
    code = ranks[first].returncode
    if code is not None and code < 0:
        killer = signal.Signals(-code).name
        return f"rank {first} of {world} was killed by {killer} after {seconds:.1f} s"
    if said[first] is not None:
        return f"rank {first} of {world} failed after {seconds:.1f} s: {said[first]['reason']}"
    return f"rank {first} of {world} exited with code {code} after {seconds:.1f} s; see the log"


def _said(job: Path, rank: int) -> dict | None:
    """What a failed rank wrote of its failure (``training_rank``): its reason and when
    (the monotonic clock), or None."""
    try:
        said = json.loads((job / f"rank-{rank}.error").read_text())
        return {"reason": one_line(str(said["reason"])), "at": float(said["at"])}
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _last_step(job: Path, rank: int, started: float) -> float:
    """When ``rank`` last began a step (the monotonic clock), ``started`` before its first."""
    try:
        age = time.time() - (job / f"rank-{rank}.steps").stat().st_mtime
    except OSError:
        return started
    return max(started, time.monotonic() - age)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
