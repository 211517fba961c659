"""The global model sent at half precision (``--downlink fp16``, issue 36).

The rounding and its mark (``fedweave/downlink.py``), the coordinator's grid that rounds each
model as it leaves (``coordinator/rounds/downlink.py``) and the site's mod that restores it
(``client/downlink_mod.py``) on Flower's real ``Message`` records, a site refusing a mark that
does not fit, the option's one-line refusal, and real simulations (SecAgg+, and FedBuff)
whose history counts the halved bytes while the coordinator's checkpoints keep full precision.
The deployed path is ``tests/test_deploy_compression.py`` (int8 up, fp16 down). Accuracy
against ``full``: ``bench/bench_downlink.py``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from flwr.app import Context, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import (
    EvaluateIns,
    FitIns,
    bytes_to_ndarray,
    ndarray_to_bytes,
    ndarrays_to_parameters,
)
from flwr.compat.common import recorddict_compat as compat

from fedweave.client.downlink_mod import downlink_restored
from fedweave.contract import DOWNLINK_KEY, SiteRefusal
from fedweave.coordinator.rounds.downlink import HalfPrecisionGrid
from fedweave.coordinator.rounds.traffic import payload_bytes
from fedweave.downlink import halved, mark_problem, restored

HALF_EPSILON = 2.0**-11
"""float16's relative rounding error for normal numbers (half a unit in the last place)."""


def _model(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.normal(0, 0.3, (64, 32)).astype(np.float32),
        rng.normal(0, 1e-2, 32).astype(np.float32),
        np.arange(5, dtype=np.int64),  # a counter: never rounded
        rng.normal(0, 1.0, (3, 3)),  # float64: rounded, restored to float64
        np.array([1.0, 1e6], dtype=np.float32),  # beyond float16's 65,504: sent whole
    ]


def test_floats_that_half_precision_holds_are_rounded_and_restored_to_their_dtypes():
    weights = _model()
    sent, mark = halved(weights)
    assert mark == "f4,f4,,f8,"
    assert [a.dtype for a in sent] == [np.float16, np.float16, np.int64, np.float16, np.float32]
    assert mark_problem(mark, [a.dtype for a in sent]) is None
    back = restored(sent, mark)
    assert [a.dtype for a in back] == [a.dtype for a in weights]
    for got, want in zip(back, weights):
        np.testing.assert_allclose(got, want, rtol=HALF_EPSILON, atol=6e-8)  # 6e-8: subnormals
    np.testing.assert_array_equal(back[2], weights[2])
    np.testing.assert_array_equal(back[4], weights[4])
    assert not np.array_equal(back[0], weights[0])  # it was rounded, not passed through
    assert sum(a.nbytes for a in sent) < 0.6 * sum(a.nbytes for a in weights)


@pytest.mark.parametrize(
    ("mark", "dtypes", "problem"),
    [
        ("f4", [np.float16, np.float16], "names 1 tensors, the message holds 2"),
        ("f4,f2", [np.float16, np.float16], "tensor 1 is 'f2', not f4 or f8"),
        ("f4,", [np.float32, np.int64], "tensor 0 is marked halved but arrived as float32"),
        (7, [np.float16], "is a int, not text"),
    ],
)  # fmt: skip
def test_a_mark_that_does_not_fit_its_arrays_is_named(mark, dtypes, problem):
    assert problem in mark_problem(mark, [np.dtype(d) for d in dtypes])


def _message(content: RecordDict, node: int, kind: str = MessageType.TRAIN) -> Message:
    metadata = Metadata(
        run_id=1, message_id="", src_node_id=0, dst_node_id=node, reply_to_message_id="",
        group_id="1", created_at=0.0, ttl=60.0, message_type=kind,
    )  # fmt: skip
    return Message(content=content, metadata=metadata)


def _site_sees(message: Message) -> list[np.ndarray]:
    """What the site's app gets once ``downlink_restored`` has run on ``message``."""
    seen = []
    context = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})

    def app(msg, ctx):
        if msg.metadata.message_type == MessageType.TRAIN:
            ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        else:
            ins = compat.recorddict_to_evaluateins(msg.content, keep_input=True)
        seen.extend(bytes_to_ndarray(tensor) for tensor in ins.parameters.tensors)
        assert DOWNLINK_KEY not in ins.config
        return Message(RecordDict(), reply_to=msg)

    downlink_restored(message, context, app)
    return seen


def test_the_grid_rounds_each_model_once_as_it_leaves_and_the_site_restores_it():
    """Three fit instructions built as Flower's workflows build them (one ``FitIns``, a
    record dict per site) and an evaluation: each leaves with half the array bytes and the
    mark in its config, the sites' instructions share one rounded model, and the site's app
    sees the model in its own dtypes, within half precision's rounding of the coordinator's."""
    weights = _model()
    fit = FitIns(ndarrays_to_parameters(weights), {"round": 1})
    messages = [_message(compat.fitins_to_recorddict(fit, keep_input=True), n) for n in (1, 2, 3)]
    evaluate = EvaluateIns(ndarrays_to_parameters(weights), {"round": 1})
    messages.append(_message(compat.evaluateins_to_recorddict(evaluate, keep_input=True), 1,
                             MessageType.EVALUATE))  # fmt: skip
    full = payload_bytes(messages[0].content)
    assert full == sum(len(ndarray_to_bytes(w)) for w in weights)

    sent = HalfPrecisionGrid.halve(messages)
    expected = sum(len(ndarray_to_bytes(a)) for a in halved(weights)[0])
    assert [payload_bytes(m.content) for m in sent] == [expected] * 4
    assert expected < 0.6 * full
    records = [m.content.array_records["fitins.parameters"] for m in sent[:3]]
    assert records[0] is records[1] is records[2]  # rounded once for the exchange
    assert HalfPrecisionGrid.halve(sent[:1])[0].content.array_records["fitins.parameters"] is (
        records[0]
    )  # a message already rounded is left as it is

    for message in (sent[0], sent[3]):
        seen = _site_sees(message)
        assert [a.dtype for a in seen] == [w.dtype for w in weights]
        for got, want in zip(seen, weights):
            np.testing.assert_allclose(got, want, rtol=HALF_EPSILON, atol=6e-8)


def test_a_site_refuses_a_mark_that_does_not_fit_the_model_it_came_with():
    weights = _model()
    content = compat.fitins_to_recorddict(
        FitIns(ndarrays_to_parameters(weights), {"round": 1, DOWNLINK_KEY: "f4,f4"}),
        keep_input=True,
    )  # fmt: skip
    with pytest.raises(SiteRefusal, match="names 2 tensors, the message holds 5"):
        _site_sees(_message(content, 4))


def test_messages_without_the_mark_reach_the_app_untouched():
    weights = _model()
    content = compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters(weights), {}), True)
    seen = _site_sees(_message(content, 4))
    for got, want in zip(seen, weights):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_an_unknown_downlink_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients", "3",
         "--rounds", "1", "--db", "none", "--out", str(tmp_path / "r"), "--downlink", "bf16"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--downlink" in lines[0] and "fp16" in lines[0], lines


def _simulate(tmp_path, *flags: str) -> tuple[list[dict], list[dict], object, list]:
    from fedweave.history import open_store
    from fedweave.learning.weights import load_weights_npz

    tmp_path.mkdir(exist_ok=True)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--task", "digits", "--clients", "3",
         "--rounds", "2", "--db", db, "--out", str(tmp_path / "r"),
         "--checkpoint-dir", str(tmp_path / "ck"), "--downlink", "fp16", *flags],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global model sent at fp16 (half the bytes down)" in done.stderr
    with open_store(db) as store:
        run = store.list_runs()[0]
        ref = store.latest_checkpoint(run.run_id)
        checkpoint = load_weights_npz(ref.path, ref.sha256) if ref is not None else []
        return store.rounds(run.run_id), store.site_results(run.run_id), run, checkpoint


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_simulated_runs_send_half_the_bytes_down_and_keep_full_precision_at_the_coordinator(
    tmp_path,
):
    """SecAgg+ (the default) and FedBuff without it, for real: every site's result is ok,
    each round's bytes out are the halved model to each site to train and to evaluate (the
    async run's: one job a site), the run records ``downlink = fp16``, and the coordinator's
    checkpoint is float32 values that half precision does not hold (it is never rounded)."""
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import get_weights

    weights = get_weights(load_task("digits").build_model())
    half = sum(len(ndarray_to_bytes(a)) for a in halved(weights)[0])
    full = sum(len(ndarray_to_bytes(w)) for w in weights)
    assert half < 0.55 * full

    rounds, sites, run, checkpoint = _simulate(tmp_path / "secagg")
    assert [s["status"] for s in sites] == ["ok"] * 6, sites
    assert run.config["settings"]["federation"]["downlink"] == "fp16"
    for row in rounds:
        # the model to 3 sites to train and 3 to evaluate; SecAgg+'s keys and shares beside
        assert 6 * half <= row["bytes_out"] < 6 * half + 0.2 * full, row
    assert rounds[-1]["eval_accuracy"] > 0.5  # chance is 0.1 on ten digits
    kept = [w for w in checkpoint if w.dtype == np.float32]
    assert kept and any(not np.array_equal(w, w.astype(np.float16)) for w in kept)

    rounds, sites, _run, _checkpoint = _simulate(
        tmp_path / "async", "--no-secure-agg", "--schedule", "async", "--buffer", "2"
    )
    assert sites and all(s["status"] == "ok" for s in sites), sites
    jobs_out = sum(row["bytes_out"] for row in rounds)
    assert jobs_out > 0 and jobs_out % half == 0, (jobs_out, half)
