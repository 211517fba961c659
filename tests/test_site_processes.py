"""A site's local training across processes (``--nproc-per-node``), on CPU with gloo: the
update equals one process's, a rank that dies or stops fails the job naming it, no rank is
left behind, and what cannot run so is refused before anything starts."""

from __future__ import annotations

import copy
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedweave.learning.data import load_site_data, save_site_npz
from fedweave.learning.evaluation_split import hold_out
from fedweave.learning.site_processes import (
    RANK_MODULE,
    SiteData,
    SiteProcesses,
    SiteProcessesFailed,
    processes_problem,
    train_across_processes,
)
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig, part_size
from fedweave.learning.weights import get_weights

TESTS = Path(__file__).parent
SITE_EXAMPLES = 16 * 17 + 2
"""With 10% held out the site trains on 16*15 + 7 examples: its last batch (7) splits 4 + 3,
and with one example left over in a batch of 2 processes' parts, one part is empty."""
TOLERANCE = 1e-5
"""Weights after two epochs agree this closely (measured: 1.5e-7 of weights up to 0.6)."""


@pytest.fixture
def site_file(tmp_path: Path) -> Path:
    train, _ = load_task("digits").load_data()
    path = tmp_path / "site.npz"
    save_site_npz(path, train.subset(np.arange(SITE_EXAMPLES)))
    return path


def _ranks_alive() -> list[int]:
    """Pids of every rank process still running (any job)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if RANK_MODULE.encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.fixture
def tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks can import this folder's task modules."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "batch_size"),
    [("digits", 16), ("digits", 1), ("declaring_tasks:ShardedDigits", 16)],
)
def test_two_processes_make_the_update_one_process_makes(
    site_file: Path, spec: str, batch_size: int, tests_importable: None
):
    task = load_task(spec)
    data, _ = hold_out(load_site_data(site_file, task, None), 0.1)
    torch.manual_seed(0)
    alone = task.build_model()
    together = copy.deepcopy(alone)
    config = TrainConfig.for_task(task, seed=7, device="cpu", epochs=2, batch_size=batch_size)
    config = (
        config
        if batch_size == 16
        else TrainConfig.for_task(  # one epoch of single steps
            task, seed=7, device="cpu", epochs=1, batch_size=1, work_fraction=0.1
        )
    )

    expected = task.train(alone, data, config)
    got = train_across_processes(SiteProcesses(2, SiteData(spec, str(site_file))), together,
                                 config)  # fmt: skip

    worst = max(float(np.abs(a - b).max()) for a, b in zip(get_weights(alone),
                                                            get_weights(together)))  # fmt: skip
    assert worst < TOLERANCE
    assert any(float(np.abs(a - b).max()) > 0 for a, b in zip(get_weights(alone),
               get_weights(task.build_model())))  # it trained  # fmt: skip
    assert got["processes"] == 2.0
    assert got["num_examples"] == expected["num_examples"] == len(data)
    assert got["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
    assert not _ranks_alive()


def test_parts_cover_each_batch_once():
    for batch in (1, 2, 7, 16):
        assert sum(part_size(batch, rank, 3) for rank in range(3)) == batch


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_rank_that_dies_or_stops_fails_the_job_naming_it(
    site_file: Path, fault: str, monkeypatch: pytest.MonkeyPatch, tests_importable: None
):
    monkeypatch.setenv("FEDWEAVE_TEST_RANK_FAULT", fault)
    task = load_task("digits")
    model = task.build_model()
    before = get_weights(model)
    processes = SiteProcesses(
        2, SiteData("fault_tasks:RankFaultDigits", str(site_file)), stall_seconds=3.0
    )
    started = time.monotonic()
    with pytest.raises(SiteProcessesFailed) as failed:
        train_across_processes(processes, model, TrainConfig.for_task(task, device="cpu"))
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
    assert not list(Path(tempfile.gettempdir()).glob("fedweave-ranks-*"))


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
    worst = max(float(np.abs(a - b).max()) for a, b in zip(alone.weights().values(),
                                                            together.weights().values()))  # fmt: skip
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
