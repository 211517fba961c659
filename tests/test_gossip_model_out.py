"""The model out, and a peer that resumes itself: peers checkpoint every N rounds and at the
end in the history's checkpoint format; ``fedweave history export`` gives a peer's final
model, which ``build_model()`` loads and which scores what the history says; a peer killed
with SIGKILL and started again with ``--resume latest`` continues its own run from its last
checkpoint. Real peer processes on loopback, real SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from vector_peer import SCRIPT as VECTOR_PEER

from fedweave.addresses import free_ports

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", FEDWEAVE_DB="none")


def _spawn(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(VECTOR_PEER), "peer", "--log-level", "info", *args]
    with log.open("ab") as handle:
        return subprocess.Popen(cmd, env=_env(), stdout=handle, stderr=subprocess.STDOUT, cwd=cwd)


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_peers_exported_model_loads_into_build_model_and_scores_its_history(
    tmp_path: Path,
) -> None:
    from fedweave.config import RunConfig
    from fedweave.history import open_store
    from fedweave.learning.data import load_site_data
    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import TrainConfig
    from fedweave.learning.weights import load_weights_npz, set_weights

    split = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "data", "split", "--out", str(tmp_path / "data"),
         "--clients", "2", "--task", "digits"],
        env=_env(), capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert split.returncode == 0, split.stderr
    ports = free_ports(2)
    procs = []
    for i in range(2):
        args = [
            "--listen", f"tcp://127.0.0.1:{ports[i]}", "--insecure", "--task", "digits",
            "--data", str(tmp_path / "data" / f"site-{i}.npz"),
            "--test-data", str(tmp_path / "data" / "test.npz"), "--rounds", "7",
            "--checkpoint-every", "3", "--db", f"sqlite:///{tmp_path / f'h{i}.db'}",
            "--exchange-timeout", "2",
        ]  # fmt: skip
        if i:
            args += ["--seeds", f"tcp://127.0.0.1:{ports[0]}"]
        procs.append(_spawn(args, tmp_path / f"p{i}.log", tmp_path))
    assert _wait_all(procs, 120) == [0, 0], (tmp_path / "p1.log").read_text()[-2000:]
    db = f"sqlite:///{tmp_path / 'h1.db'}"
    store = open_store(db)
    info = store.get_run("latest")
    rounds = store.rounds(info.run_id)
    checkpointed = [r["round"] for r in rounds if r["checkpoint_path"]]
    assert checkpointed == [3, 6, 7]  # every 3 rounds and the last
    assert all(Path(r["checkpoint_path"]).parent.parent.name == info.run_id for r in rounds
               if r["checkpoint_path"])  # fmt: skip
    export = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "history", "export", "latest", "--to",
         str(tmp_path / "out"), "--db", db],
        env=_env(), capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert export.returncode == 0 and "model.npz" in export.stdout, export.stderr
    task = load_task("digits")
    model = task.build_model()
    set_weights(model, load_weights_npz(tmp_path / "out" / "model.npz"))
    test = load_site_data(tmp_path / "data" / "test.npz", task)
    scored = task.evaluate(model, test, TrainConfig.of(RunConfig().training))["accuracy"]
    recorded = rounds[-1]["eval_accuracy"]
    print(f"exported model scores {scored:.4f}; history says {recorded:.4f} (round 7)")
    assert abs(scored - recorded) < 1e-9 and recorded > 0.6
    sites = store.site_results(info.run_id)
    # partners are recorded with the example count they stated (0 only for one that was busy
    # before it ever sent a model)
    assert sum(s["num_examples"] > 0 for s in sites) >= len(sites) - 2, sites
    assert rounds[-1]["extra"]["consensus_estimate"] is not None


def test_a_killed_peer_resumes_its_own_run_from_its_last_checkpoint(tmp_path: Path) -> None:
    from fedweave.history import open_store

    ports = free_ports(2)
    np.save(tmp_path / "a.npy", np.zeros(4))
    np.save(tmp_path / "b.npy", np.full(4, 8.0))
    common = ["--insecure", "--round-interval", "0.1", "--exchange-timeout", "1"]
    a = _spawn(
        ["--listen", f"tcp://127.0.0.1:{ports[0]}", "--vector", str(tmp_path / "a.npy"),
         "--rounds", "0", "--results", str(tmp_path / "a.jsonl"), *common],
        tmp_path / "a.log", tmp_path,
    )  # fmt: skip
    b_args = [
        "--listen", f"tcp://127.0.0.1:{ports[1]}", "--vector", str(tmp_path / "b.npy"),
        "--seeds", f"tcp://127.0.0.1:{ports[0]}", "--rounds", "30", "--checkpoint-every", "5",
        "--db", f"sqlite:///{tmp_path / 'b.db'}", "--linger", "0",
        "--results", str(tmp_path / "b.jsonl"), *common,
    ]  # fmt: skip
    b = _spawn(b_args, tmp_path / "b.log", tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(
                e["event"] == "round" and e["round"] >= 12 for e in _events(tmp_path / "b.jsonl")
            ):
                break
            time.sleep(0.05)
        b.send_signal(signal.SIGKILL)
        b.wait()
        store = open_store(f"sqlite:///{tmp_path / 'b.db'}")
        run_id = store.get_run("latest").run_id
        killed_at = max(r["round"] for r in store.rounds(run_id))
        kept = max(r["round"] for r in store.rounds(run_id) if r["checkpoint_path"])
        b2 = _spawn([*b_args, "--resume", "latest"], tmp_path / "b.log", tmp_path)
        assert _wait_all([b2], 90) == [0], (tmp_path / "b.log").read_text()[-2000:]
    finally:
        a.send_signal(signal.SIGTERM)
        _wait_all([a], 20)
    log = (tmp_path / "b.log").read_text()
    assert f"resuming run {run_id} from this peer's checkpoint of round {kept}" in log, log[-2000:]
    store = open_store(f"sqlite:///{tmp_path / 'b.db'}")
    assert [r.run_id for r in store.list_runs()] == [run_id]  # its own run, no new one
    info = store.get_run(run_id)
    assert info.status == "completed", info
    rows = store.rounds(run_id)
    print(f"killed after round {killed_at}; resumed from round {kept}; rounds {rows[0]['round']}-"
          f"{rows[-1]['round']} recorded")  # fmt: skip
    assert kept % 5 == 0 and [r["round"] for r in rows] == list(range(1, 31))  # once each
    assert rows[-1]["checkpoint_path"]  # the model out at the end
