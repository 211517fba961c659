"""Asynchronous federation under SecAgg+ (FedBuff with secure buffers): a site holds its
trained update and sends it, scaled by its staleness weight, only inside its buffer's SecAgg+
round; the coordinator's step equals plain FedBuff's within SecAgg+'s quantization error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Context, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from test_secure_agg import run_recorded

from fedweave.client.held_updates import holding_updates_when_asked
from fedweave.config import RunConfig
from fedweave.config.commands import check_settings
from fedweave.contract import (
    DELIVER_KEY,
    HELD_METRIC,
    HOLD_KEY,
    JOB_KEY,
    STALENESS_WEIGHT_KEY,
    UpdateRejected,
)
from fedweave.coordinator.rounds.round_settings import ServerSettings
from fedweave.coordinator.rounds.secure_agg import SecAggSettings
from fedweave.errors import UserError


def _train_message(weights: list[np.ndarray], config: dict) -> Message:
    ins = FitIns(ndarrays_to_parameters(weights), config)
    metadata = Metadata(
        run_id=1, message_id="m1", src_node_id=0, dst_node_id=7, reply_to_message_id="",
        group_id="3", created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN,
    )  # fmt: skip
    return Message(content=compat.fitins_to_recorddict(ins, True), metadata=metadata)


def _trained(by: float, examples: int):
    """A ClientApp that moves every weight by ``by`` and reports ``examples``."""

    def app(msg: Message, context: Context) -> Message:
        ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        moved = [w + by for w in parameters_to_ndarrays(ins.parameters)]
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(moved), examples,
                     {"train_loss": 0.5})  # fmt: skip
        return Message(compat.fitres_to_recorddict(res, True), reply_to=msg)

    return app


def test_a_site_holds_its_update_and_sends_it_scaled_only_when_its_buffer_asks():
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    base = [np.full((2, 3), 1.0, np.float32), np.zeros(4, np.float32)]
    held = holding_updates_when_asked(
        _train_message(base, {HOLD_KEY: True, JOB_KEY: 12}), context, _trained(0.25, 40)
    )
    res = compat.recorddict_to_fitres(held.content, keep_input=True)
    assert res.parameters.tensors == []  # nothing of the update leaves with the job's reply
    assert res.num_examples == 40 and res.metrics[HELD_METRIC] == 12
    assert res.metrics["train_loss"] == 0.5

    def must_not_train(msg, context):
        raise AssertionError("a delivery trains nothing")

    for weight in (0.0, -1.0, 2.0, float("nan")):  # not a staleness weight: nothing is sent
        with pytest.raises(UpdateRejected, match="outside"):
            holding_updates_when_asked(
                _train_message([], {DELIVER_KEY: 12, STALENESS_WEIGHT_KEY: weight}),
                context, must_not_train,
            )  # fmt: skip
    asked = {DELIVER_KEY: 12, STALENESS_WEIGHT_KEY: 0.5}
    sent = holding_updates_when_asked(_train_message([], asked), context, must_not_train)
    res = compat.recorddict_to_fitres(sent.content, keep_input=True)
    update = parameters_to_ndarrays(res.parameters)
    assert res.num_examples == 40 and res.metrics[HELD_METRIC] == 12
    assert [u.shape for u in update] == [(2, 3), (4,)]
    assert all(np.allclose(u, 0.5 * 0.25) and u.dtype == np.float32 for u in update)
    with pytest.raises(UpdateRejected, match="it holds none"):  # sent once, then gone
        holding_updates_when_asked(_train_message([], asked), context, must_not_train)
    holding_updates_when_asked(
        _train_message(base, {HOLD_KEY: True, JOB_KEY: 13}), context, _trained(1.0, 40)
    )
    with pytest.raises(UpdateRejected, match="it holds job 13's"):
        holding_updates_when_asked(_train_message([], asked), context, must_not_train)
    plain = holding_updates_when_asked(_train_message(base, {}), context, _trained(1.0, 40))
    assert len(compat.recorddict_to_fitres(plain.content, True).parameters.tensors) == 2


def test_a_secure_buffer_needs_a_secagg_cohort():
    config = RunConfig.of(clients=6, secure_agg=True, schedule="async", buffer=2)
    with pytest.raises(UserError, match=r"--buffer 2: under SecAgg\+ each buffer is a SecAgg"):
        check_settings(config, "simulate")  # the sites: --clients 6
    unset = RunConfig.of(clients=6, secure_agg=True, schedule="async")
    assert ServerSettings(unset, 6, 3).buffer == 3  # the default rises to a cohort's smallest


def _moved_by(node_id: int) -> float:
    return 0.01 * (1 + node_id % 7)


def _examples_of(node_id: int) -> int:
    return 10 + node_id % 5


@pytest.mark.slow
def test_a_secure_buffer_unmasks_exactly_fedbuffs_weighted_step():
    """Real SecAgg+ (fedweave's masks and stages) in Flower's simulation engine: three sites
    hold updates of known sizes; one buffer's SecAgg+ round gives the coordinator
    sum_i n_i s_i update_i / sum_i n_i, within one quantization step per site."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.server import ServerApp
    from flwr.simulation import run_simulation

    from fedweave.client.mods import secagg_when_asked
    from fedweave.coordinator.rounds.deadlines import RoundDeadline
    from fedweave.coordinator.rounds.secure_agg import make_secagg_workflow
    from fedweave.coordinator.rounds.secure_buffer import secure_buffer_sum
    from fedweave.coordinator.rounds.traffic import Traffic
    from fedweave.flower_patches.secagg_masks import unflatten

    shapes = [(3, 4), (5,)]
    seen: dict = {}

    class Moving(NumPyClient):
        def __init__(self, node_id: int) -> None:
            self.node_id = node_id

        def fit(self, parameters, config):
            moved = [p + _moved_by(self.node_id) for p in parameters]
            return moved, _examples_of(self.node_id), {}

    client_app = ClientApp(
        client_fn=lambda context: Moving(context.node_id).to_client(),
        mods=[secagg_when_asked, holding_updates_when_asked],
    )
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context) -> None:
        from fedweave.coordinator.rounds.fedbuff import _wait_for_nodes

        nodes = _wait_for_nodes(grid, 3, timeout=60)
        base = [np.ones(shape, np.float32) for shape in shapes]
        jobs = []
        for job, node in enumerate(nodes, start=1):
            ins = FitIns(ndarrays_to_parameters(base), {HOLD_KEY: True, JOB_KEY: job})
            jobs.append(Message(compat.fitins_to_recorddict(ins, True), dst_node_id=node,
                                message_type=MessageType.TRAIN, group_id="1"))  # fmt: skip
        held = {}
        for reply in grid.send_and_receive(jobs, timeout=120):
            res = compat.recorddict_to_fitres(reply.content, keep_input=True)
            held[reply.metadata.src_node_id] = (res.parameters.tensors, res.metrics[HELD_METRIC])
        weights = dict(zip(nodes, (1.0, 0.5, 1 / 3)))
        members = {node: (held[node][1], weights[node]) for node in nodes}
        workflow = make_secagg_workflow(SecAggSettings(timeout=120), len(nodes),
                                        RoundDeadline(120.0))  # fmt: skip
        traffic = Traffic()
        result = secure_buffer_sum(grid, context, workflow, 2, members, {}, traffic)
        seen.update(nodes=nodes, held=held, weights=weights, result=result, traffic=traffic,
                    update=unflatten(result.update, base))  # fmt: skip

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=3,
                   backend_config={"client_resources": {"num_cpus": 1}})  # fmt: skip
    nodes, weights, result = seen["nodes"], seen["weights"], seen["result"]
    assert all(tensors == [] for tensors, _job in seen["held"].values())  # held, not sent
    assert sorted(result.delivered) == nodes and not result.dropped
    total = sum(_examples_of(n) for n in nodes)
    expected = sum(_examples_of(n) * weights[n] * _moved_by(n) for n in nodes) / total
    settings = SecAggSettings()
    bound = 3 * settings.quantization_step() * settings.max_weight / total + 1e-6
    assert [u.shape for u in seen["update"]] == shapes
    for update in seen["update"]:
        assert np.max(np.abs(update - expected)) <= bound, (update, expected, bound)
    assert sum(site.train_in for site in seen["traffic"].of_round(2).values()) > 0


@pytest.mark.slow
def test_secure_buffers_record_each_step_with_three_sites_and_their_staleness(tmp_path):
    sim = RunConfig.of(
        task="digits", clients=5, rounds=6, partition="iid", seed=2, secure_agg=True,
        schedule="async", buffer=3, site_speeds="lognormal:1",
    )  # fmt: skip
    rows, secure, sites, _ = run_recorded(sim, tmp_path, "secure")
    assert [r["round"] for r in secure] == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        members = [s for s in sites if s["round"] == step and s["status"] == "ok"]
        assert len({s["site_id"] for s in members}) == 3  # every buffer: 3 distinct sites
        assert all(HELD_METRIC in s["metrics"] and "staleness" in s["metrics"] for s in members)
    assert max(s["metrics"]["staleness"] for s in sites if s["status"] == "ok") >= 1
    assert all(r["bytes_in"] > 0 and r["bytes_out"] > 0 for r in secure)
    assert rows[-1]["accuracy"] > 0.6 and math.isfinite(rows[-1]["loss"])
