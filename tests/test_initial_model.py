"""``--initial-model FILE.safetensors`` (issue 35, first part): a run starts from a pretrained
model, checked against the task's model and pinned by its sha256; gossip peers that started
from different files refuse each other (``start-mismatch``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from fedweave.errors import UserError
from fedweave.gossip import wire
from fedweave.learning.initial_model import (
    load_initial_model,
    pinned_initial_model,
    read_initial_model,
)
from fedweave.learning.tasks import load_task

FEDWEAVE = [sys.executable, "-m", "fedweave.cli"]


def _save(path: Path, tensors: dict) -> Path:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


def _pretrained(path: Path, epochs: int = 20) -> Path:
    """The digits model trained centrally on scikit-learn's digits, saved as safetensors."""
    import torch
    from safetensors.torch import save_file
    from sklearn.datasets import load_digits

    torch.manual_seed(1)
    model = load_task("digits").build_model()
    x, y = load_digits(return_X_y=True)
    inputs = torch.tensor(x / 16.0, dtype=torch.float32)
    labels = torch.tensor(y)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    save_file(model.state_dict(), str(path))
    return path


def test_a_file_that_does_not_fit_the_model_is_one_line_naming_each_misfit(tmp_path):
    """Missing, unexpected and mis-shaped tensors, NaN, a file that is not safetensors and a
    missing file: each one line (the docs' example is this test's first case)."""
    model = load_task("digits").build_model()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    wrong = {k: v for k, v in state.items() if k != "4.bias"}
    wrong["4.weight"] = np.zeros((12, 64), dtype=np.float32)
    with pytest.raises(UserError) as info:
        read_initial_model(_save(tmp_path / "start.safetensors", wrong), model, "digits")
    docs = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    shown = str(info.value).replace(str(tmp_path / "start.safetensors"), "start.safetensors")
    assert f"error: {shown}" in docs, shown
    extra = {**state, "head.weight": np.zeros(3, dtype=np.float32)}
    with pytest.raises(UserError, match="unexpected head.weight"):
        read_initial_model(_save(tmp_path / "extra.safetensors", extra), model, "digits")
    halves = {k: v.astype(np.float16) if k == "0.weight" else v for k, v in state.items()}
    with pytest.raises(UserError, match=r"mis-shaped 0.weight \[64, 64\] float16 in the file"):
        read_initial_model(_save(tmp_path / "half.safetensors", halves), model, "digits")
    poisoned = {**state, "2.bias": np.full(64, np.nan, dtype=np.float32)}
    with pytest.raises(UserError, match="holds NaN or infinite values in 2.bias"):
        read_initial_model(_save(tmp_path / "nan.safetensors", poisoned), model, "digits")
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04" + bytes(200))  # a torch.save zip
    with pytest.raises(UserError, match="is not a safetensors file"):
        read_initial_model(tmp_path / "model.pt", model, "digits")
    with pytest.raises(UserError, match="does not exist; pass a .safetensors file"):
        read_initial_model(tmp_path / "nothing.safetensors", model, "digits")
    fits = read_initial_model(_save(tmp_path / "ok.safetensors", state), model, "digits")
    assert list(fits) == list(state)


def test_the_pin_keeps_a_resume_on_the_runs_file(tmp_path):
    """A resume keeps the recorded pin; another file, a file where the run had none, or a
    run's file gone before its first checkpoint is refused with both named."""
    model = load_task("digits").build_model()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    first = _save(tmp_path / "a.safetensors", state)
    other = _save(tmp_path / "b.safetensors", {k: v + 1 for k, v in state.items()})
    pin = pinned_initial_model(first, model, "digits", None, resumed=False)
    assert pin == {
        "path": str(first.resolve()),
        "sha256": hashlib.sha256(first.read_bytes()).hexdigest(),
        "tensors": len(state),
    }
    assert pinned_initial_model(None, model, "digits", pin, resumed=True, needs_file=False) == pin
    assert pinned_initial_model(first, model, "digits", pin, resumed=True) == pin
    with pytest.raises(UserError, match=f"has sha256 .*, the run started from {first.resolve()}"):
        pinned_initial_model(other, model, "digits", pin, resumed=True)
    with pytest.raises(UserError, match="started from the task's own initialisation"):
        pinned_initial_model(first, model, "digits", None, resumed=True)
    assert pinned_initial_model(None, model, "digits", None, resumed=False) is None
    first.write_bytes(other.read_bytes())  # the run's file changed before any checkpoint
    with pytest.raises(UserError, match="is gone or changed, and the run has no checkpoint"):
        pinned_initial_model(None, model, "digits", pin, resumed=True, needs_file=True)
    with pytest.raises(UserError, match="the run started from"):
        load_initial_model(model, first, "digits", pin["sha256"])


def _accuracy_on(model_file: Path, test_file: Path) -> float:
    from safetensors.torch import load_file

    from fedweave.learning.data import load_site_data
    from fedweave.learning.training import TrainConfig

    task = load_task("digits")
    model = task.build_model()
    model.load_state_dict(load_file(str(model_file)))
    return task.evaluate(model, load_site_data(test_file, task), TrainConfig(device="cpu"))[
        "accuracy"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["federated", "gossip"])
def test_a_simulation_starts_from_the_initial_model_and_pins_it(tmp_path, mode):
    """With ``--lr 0`` nothing moves: round 1 scores exactly what the pretrained file scores
    on the run's test split (the fresh model scores chance), in both modes; the history pins
    the file's sha256, and a file that does not fit is one line before anything starts."""
    start = _pretrained(tmp_path / "pretrained.safetensors")
    db = f"sqlite:///{tmp_path / 'h.db'}"
    common = [
        "simulate", "--mode", mode, "--task", "digits", "--clients", "3", "--rounds", "1",
        "--lr", "0", "--seed", "0", "--db", db, "--split-dir", str(tmp_path / "split"),
        "--initial-model", str(start), "--out", str(tmp_path / "report.json"),
    ]  # fmt: skip
    if mode == "federated":
        common.append("--no-secure-agg")  # SecAgg+'s quantisation would move the model a little
    done = subprocess.run([*FEDWEAVE, *common], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    expected = _accuracy_on(start, tmp_path / "split" / "test.npz")
    assert expected > 0.8
    assert report["final_accuracy"] == pytest.approx(expected, abs=1e-6)
    from fedweave.history import open_store

    with open_store(db) as store:
        runs = [store.get_run(r.run_id) for r in store.list_runs()]
    pin = {"path": str(start.resolve()), "sha256": hashlib.sha256(start.read_bytes()).hexdigest()}
    assert len(runs) == 1 and runs[0].config["initial_model"] == {**pin, "tensors": 6}
    if mode == "gossip":
        return
    wrong = tmp_path / "wrong.safetensors"
    _save(wrong, {"0.weight": np.zeros((3, 3), dtype=np.float32)})
    refused = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "digits", "--clients", "3", "--rounds", "1",
         "--db", db, "--initial-model", str(wrong)],
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-2000:]
    lines = refused.stderr.strip().splitlines()
    assert "Traceback" not in refused.stderr and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"error: --initial-model {wrong} does not fit the model")
    with open_store(db) as store:
        assert len(store.list_runs()) == 1  # refused before anything was recorded


def test_a_gossip_offer_from_another_start_is_refused_with_both_digests():
    """A real inbox on a real socket: an offer whose ``start`` is another initial model's
    sha256 (or absent: the task's own initialisation) is dropped as ``start-mismatch`` and
    answered ``refused`` naming both; the same start is taken; a malformed one is refused."""
    from fedweave.gossip.inbox import Inbox
    from fedweave.gossip.transport import Transport

    ours, theirs = "a" * 64, "b" * 64
    model = {"x": np.zeros(4, dtype=np.float32)}
    schema = wire.schema_hash(model)
    seen: list[wire.Message] = []
    refusals: list[str] = []
    receiver = Transport("tcp://127.0.0.1:0", None, 1 << 20)
    inbox = Inbox(receiver, schema, 1 << 20, lambda inc, msg: seen.append(msg), lambda: False,
                  ours)  # fmt: skip
    inbox.refuse = lambda route, msg, reason: refusals.append(reason)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)

    def offer(start: str) -> None:
        message = wire.Message(wire.OFFER, "p1", "tcp://127.0.0.1:9", num_examples=5,
                               tensors=dict(model), start=start)  # fmt: skip
        sock.send_multipart(wire.encode(message))

    try:
        sock.connect(receiver.address)
        for start in (theirs, "", ours):
            offer(start)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            inbox.serve(0.1)
        assert [m.start for m in seen] == [ours]
        assert inbox.drops == {"start-mismatch": 2}, inbox.drops
        assert refusals == [
            f"start-mismatch: this peer started from initial model sha256 {ours[:16]}, yours "
            f"from sha256 {theirs[:16]}; start every peer with the same --initial-model",
            f"start-mismatch: this peer started from initial model sha256 {ours[:16]}, yours "
            "from none (the task's own initialisation); start every peer with the same "
            "--initial-model",
        ]
    finally:
        sock.close(0)
        ctx.term()
        receiver.close()
    bad = wire.encode(wire.Message(wire.OFFER, "p1", "", tensors=dict(model), start="A" * 64))
    with pytest.raises(wire.WireError, match="start must be 64 lowercase hex digits"):
        wire.decode(bad)
    plain = wire.encode(wire.Message(wire.OFFER, "p1", "", tensors=dict(model)))
    assert wire.decode(plain).start == "" and b'"start"' not in plain[0]
