"""A site's local training across processes (``--nproc-per-node``), on CPU with gloo: the
update equals one process's, round after round in the same processes; a rank that dies or
stops fails the job naming it, no rank is left behind and the next job starts new ones; and
what cannot run so is refused before anything starts."""

from __future__ import annotations

import copy
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fault_tasks import RANK_FAULT_ENV

from fedweave.learning.data import load_site_data, save_site_npz
from fedweave.learning.evaluation_split import hold_out
from fedweave.learning.site_processes import (
    JOB_PREFIX,
    RANK_MODULE,
    SiteData,
    SiteProcesses,
    SiteProcessesFailed,
    close_site_processes,
    processes_problem,
    train_across_processes,
)
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig, part_size
from fedweave.learning.weights import get_weights

TESTS = Path(__file__).parent
SITE_EXAMPLES = 268
"""With 10% (27) held out the site trains on 241 = 16 * 15 + 1 examples: each epoch's last
batch holds one example, so one of two processes has an empty part of it."""
TOLERANCE = 1e-5
"""Weights after two epochs agree this closely (measured: 1.5e-7 of weights up to 0.6)."""


@pytest.fixture
def site_file(tmp_path: Path) -> Path:
    train, _ = load_task("digits").load_data()
    path = tmp_path / "site.npz"
    save_site_npz(path, train.subset(np.arange(SITE_EXAMPLES)))
    return path


def _ranks_alive(parent: int | None = None) -> list[int]:
    """Pids of the rank processes still running that ``parent`` (default: this process)
    started: other tests' ranks may run beside these."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            argv = cmdline.split(b"\0")
            if RANK_MODULE.encode() in argv and argv[-2] == str(parent).encode():
                found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def no_ranks_left():
    """Each test's groups stop with it (they would otherwise wait for this process's next
    job, as a site's do between rounds)."""
    yield
    close_site_processes()
    assert not _ranks_alive()
    assert not list(Path(tempfile.gettempdir()).glob(f"{JOB_PREFIX}{os.getpid()}-*"))


@pytest.fixture
def tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks can import this folder's task modules."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))  # fmt: skip


@pytest.mark.parametrize("spec", ["digits", "declaring_tasks:ShardedDigits"])
def test_two_processes_make_the_update_one_process_makes(
    site_file: Path, spec: str, tests_importable: None
):
    task = load_task(spec)
    data, _ = hold_out(load_site_data(site_file, task, None), 0.1)
    torch.manual_seed(0)
    alone = task.build_model()
    together = copy.deepcopy(alone)
    started = get_weights(alone)
    config = TrainConfig.for_task(task, seed=7, device="cpu", epochs=2)
    assert len(data) % config.batch_size == 1

    processes = SiteProcesses(2, SiteData(spec, str(site_file)))
    first: list[int] = []
    for _ in (1, 2):  # the second round in the same processes, from the first's model
        expected = task.train(alone, data, config)
        got = train_across_processes(processes, together, config)
        alive = sorted(_ranks_alive())
        assert len(alive) == 2 and alive == (first or alive)
        first = alive

        worst = max(
            float(np.abs(a - b).max()) for a, b in zip(get_weights(alone), get_weights(together))
        )
        assert worst < TOLERANCE
        assert got["processes"] == 2.0
        assert got["num_examples"] == expected["num_examples"] == len(data)
        assert got["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
    assert any(not np.array_equal(a, b) for a, b in zip(get_weights(alone), started))


def test_parts_cover_each_batch_once():
    for batch in (1, 2, 7, 16):
        assert sum(part_size(batch, rank, 3) for rank in range(3)) == batch


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_rank_that_dies_or_stops_fails_the_job_naming_it(
    site_file: Path, fault: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    tests_importable: None,
):  # fmt: skip
    monkeypatch.setenv(RANK_FAULT_ENV, f"once:{tmp_path / 'faulted'}:{fault}")
    task = load_task("digits")
    model = task.build_model()
    before = get_weights(model)
    processes = SiteProcesses(
        2, SiteData("fault_tasks:RankFaultDigits", str(site_file)), stall_seconds=3.0
    )
    config = TrainConfig.for_task(task, device="cpu")
    started = time.monotonic()
    with pytest.raises(SiteProcessesFailed) as failed:
        train_across_processes(processes, model, config)
    seconds = time.monotonic() - started

    reason = str(failed.value)
    if fault == "kill":
        assert reason.startswith("rank 1 of 2 was killed by SIGKILL after"), reason
        assert seconds < 30
    else:
        assert reason.startswith("rank 1 of 2 stopped answering; rank 0 gave up waiting"), reason
        assert seconds < 3.0 + 30
    assert all(np.array_equal(a, b) for a, b in zip(before, get_weights(model)))
    assert not _ranks_alive()
    assert not list(Path(tempfile.gettempdir()).glob(f"{JOB_PREFIX}{os.getpid()}-*"))

    assert train_across_processes(processes, model, config)["processes"] == 2.0  # anew
    assert not all(np.array_equal(a, b) for a, b in zip(before, get_weights(model)))


def test_what_cannot_run_across_processes_is_refused_in_one_line():
    digits = load_task("digits")
    cores = len(os.sched_getaffinity(0))
    assert processes_problem(1, "cpu", digits) is None
    assert processes_problem(0, "cpu", digits).startswith("--nproc-per-node 0: give at least 1")
    too_many = processes_problem(cores + 1, "cpu", digits)
    assert f"this machine gives {cores}; use --nproc-per-node {cores} or fewer" in too_many

    class OwnLoop:
        name = "own-loop"

    assert "task 'own-loop' trains in its own loop" in processes_problem(2, "cpu", OwnLoop())
    if not torch.cuda.is_available():
        assert processes_problem(2, "cuda", digits) == (
            "--device cuda: no CUDA GPU is visible; use --device cpu"
        )
    for problem in (too_many, processes_problem(2, "cpu", OwnLoop())):
        assert "\n" not in problem


def test_a_peer_trains_across_processes_as_in_one(site_file: Path):
    from gossip.learner import TaskLearner

    task = load_task("digits")
    data = load_site_data(site_file, task, None)
    config = TrainConfig.for_task(task, seed=3, device="cpu")
    alone = TaskLearner(task, data, None, config, "peer-a")
    processes = SiteProcesses(2, SiteData("digits", str(site_file), eval_fraction=0.0))
    together = TaskLearner(task, data, None, config, "peer-a", processes=processes)

    assert "processes" not in alone.train(1)
    assert together.train(1)["processes"] == 2.0
    pairs = zip(alone.weights().values(), together.weights().values())
    worst = max(float(np.abs(a - b).max()) for a, b in pairs)
    assert worst < TOLERANCE


def test_the_commands_refuse_what_cannot_run_across_processes_before_connecting(site_file):
    from test_deploy_support import free_port, run_fedweave

    cores = len(os.sched_getaffinity(0))
    address = f"127.0.0.1:{free_port()}"  # nothing listens: a check that passed would wait
    common = ("--task", "digits", "--data", str(site_file), "--insecure")
    for command, extra in (
        (("client", "--coordinator", address), ("--nproc-per-node", str(cores + 1))),
        (("client", "--coordinator", address), ("--nproc-per-node", "0")),
        (("peer", "--listen", f"tcp://{address}"), ("--nproc-per-node", str(cores + 1))),
    ):
        done = run_fedweave(*command, *common, *extra, cwd=site_file.parent, timeout=60)
        errors = [line for line in done.stderr.splitlines() if "WARNING" not in line]
        assert done.returncode == 2 and len(errors) == 1, done.stderr  # the peer warns first
        assert errors[0].startswith("error: ") and "--nproc-per-node" in errors[0], errors


def test_the_ranks_die_with_the_process_that_started_them(site_file: Path):
    import signal
    import subprocess
    import sys

    script = (
        "from fedweave.learning.site_processes import *\n"
        "from fedweave.learning.tasks import load_task\n"
        "from fedweave.learning.training import TrainConfig\n"
        "task = load_task('digits')\n"
        f"processes = SiteProcesses(2, SiteData('digits', {str(site_file)!r}))\n"
        "train_across_processes(processes, task.build_model(),"
        " TrainConfig.for_task(task, device='cpu', epochs=10_000))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_ranks_alive(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_ranks_alive(parent.pid)) == 2, "the ranks did not start"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _ranks_alive(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _ranks_alive(parent.pid)
        orphaned = list(Path(tempfile.gettempdir()).glob(f"{JOB_PREFIX}{parent.pid}-*"))
        assert len(orphaned) == 1  # its job folder, left behind
        from fedweave.learning.site_processes import _sweep_orphaned_groups

        _sweep_orphaned_groups()  # what the next group of any process does first
        assert not orphaned[0].exists()
    finally:
        parent.kill()
        for pid in _ranks_alive(parent.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL, one GPU a process)"
)
def test_two_gpus_make_the_update_one_gpu_makes(site_file: Path):
    task = load_task("digits")
    data, _ = hold_out(load_site_data(site_file, task, None), 0.1)
    torch.manual_seed(0)
    alone = task.build_model()
    together = copy.deepcopy(alone)
    config = TrainConfig.for_task(task, seed=7, device="cuda", epochs=2, amp=False)

    task.train(alone, data, config)
    processes = SiteProcesses(2, SiteData("digits", str(site_file)), device="cuda")
    assert train_across_processes(processes, together, config)["processes"] == 2.0

    pairs = zip(get_weights(alone), get_weights(together))
    assert max(float(np.abs(a - b).max()) for a, b in pairs) < 1e-4  # cuBLAS's own rounding
