"""GPU shares this machine cannot serve: one line and exit 2 before anything is written,
started or recorded (before, Flower's engine printed Ray's ``ActorPool is empty`` traceback,
recorded a failed run and hung)."""

import os
import subprocess
import sys

import pytest

from fedweave.addresses import free_ports
from fedweave.errors import UserError
from fedweave.simulations.gpus import check_gpu_share, visible_gpus

FEDWEAVE = [sys.executable, "-m", "fedweave.cli"]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
"""Every machine is one without a GPU for these runs, the lent GPU machines included."""


def _simulate(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "digits", "--clients", "3", "--rounds", "1",
         "--db", f"sqlite:///{tmp_path / 'h.db'}", "--out", str(tmp_path / "r.json"), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=NO_GPU,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--gpus-per-client", "0.5"], "--gpus-per-client 0.5"),
        (["--mode", "gossip", "--gpus-per-peer", "0.5"], "--gpus-per-peer 0.5"),
    ],
)
def test_a_gpu_share_without_a_gpu_is_one_line_and_nothing_is_recorded(tmp_path, args, flag):
    result = _simulate(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {flag}: no CUDA GPU is visible on this machine")
    assert "to train on CPU" in lines[0]
    assert ("--ray-address" in lines[0]) == ("--gpus-per-client" in flag)  # gossip has no cluster
    assert "ActorPool" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "h.db").exists() and not (tmp_path / "r.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_with_a_ray_cluster_the_gpus_may_be_elsewhere(tmp_path):
    """No GPU here is no reason to refuse: the next check (is a cluster there?) is reached."""
    (port,) = free_ports(1)
    result = _simulate(tmp_path, "--gpus-per-client", "0.5", "--ray-address", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert "no CUDA GPU" not in result.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in result.stderr


def test_no_share_asks_nothing_of_the_machine():
    check_gpu_share("--gpus-per-client", 0.0)
    check_gpu_share("--gpus-per-peer", 0.0, pooled=False)


@pytest.mark.gpu
def test_a_share_above_the_gpu_count_fits_no_pooled_site():
    gpus = visible_gpus()
    if gpus == 0:
        pytest.skip("needs a CUDA GPU")
    check_gpu_share("--gpus-per-client", 0.5)
    check_gpu_share("--gpus-per-client", float(gpus))
    with pytest.raises(UserError, match=f"this machine has {gpus} CUDA GPU"):
        check_gpu_share("--gpus-per-client", gpus + 1.0)
    check_gpu_share("--gpus-per-peer", gpus + 1.0, pooled=False)  # peers wrap round the GPUs
