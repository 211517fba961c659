"""The site mod that holds a trained update for a secure buffer (``--schedule async`` under
SecAgg+), and sends it, masked, when the buffer's SecAgg+ round asks.

Under SecAgg+, the coordinator of an asynchronous run cannot take updates one by one as they
arrive: it would see each one. So a site's job only trains. The site keeps its update (its
model less the model step it trained on, as the update check and DP passed it) in its run
state (``context.state``, which Flower keeps per run and site across messages) and answers
with the job's examples and metrics alone (``HELD_METRIC``: the job's number). Once the
coordinator has ``--buffer`` sites holding updates, it runs one SecAgg+ round among them;
each site's instruction names its held job (``DELIVER_KEY``) and the update's staleness
weight (``STALENESS_WEIGHT_KEY``), and carries no model. The site answers inside Flower's
``secaggplus_mod`` with ``staleness_weight * update`` and the job's examples, which SecAgg+
weighs by those examples: the coordinator learns only

    sum_i n_i * s_i * update_i / sum_i n_i

FedBuff's step (``fedweave/coordinator/rounds/fedbuff.py``). One update is held at a time: a new job
replaces it. A site restarted in between has lost it and says so; the SecAgg+ round then
goes on without that site.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from fedweave.contract import (
    DELIVER_KEY,
    HELD_METRIC,
    HOLD_KEY,
    JOB_KEY,
    STALENESS_WEIGHT_KEY,
    UpdateRejected,
)
from fedweave.flower_patches import message_records as compat
from fedweave.flower_patches.message_records import ClientAppCallable

HELD_RECORD = "fedweave.held-update"
"""``context.state`` key of the update this site holds (an array record)."""
HELD_JOB_RECORD = "fedweave.held-job"
"""``context.state`` key of its job's number and examples (a config record: a record dict's
names are shared by all its kinds of record)."""


def holding_updates_when_asked(
    msg: Message, context: Context, call_next: ClientAppCallable
) -> Message:
    """Hold the update of a job that asks (``HOLD_KEY``); send a held one when a SecAgg+
    round asks (``DELIVER_KEY``); every other message passes through."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    config = msg.content.config_records.get("fitins.config")
    if config is not None and DELIVER_KEY in config:
        return _deliver(msg, context, int(config[DELIVER_KEY]),
                        float(config.get(STALENESS_WEIGHT_KEY, 1.0)))  # fmt: skip
    if config is None or not config.get(HOLD_KEY):
        return call_next(msg, context)
    reply = call_next(msg, context)
    if reply.has_error() or not reply.content.array_records:
        return reply
    job = int(config.get(JOB_KEY, 0))
    fit_ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    fit_res = compat.recorddict_to_fitres(reply.content, keep_input=True)
    trained = parameters_to_ndarrays(fit_res.parameters)
    base = parameters_to_ndarrays(fit_ins.parameters)
    update = [np.ascontiguousarray(new - old) for new, old in zip(trained, base)]
    context.state.array_records[HELD_RECORD] = ArrayRecord(update)
    context.state.config_records[HELD_JOB_RECORD] = ConfigRecord(
        {"job": job, "num_examples": int(fit_res.num_examples)}
    )
    fit_res.parameters = ndarrays_to_parameters([])
    fit_res.metrics[HELD_METRIC] = job
    reply.content = compat.fitres_to_recorddict(fit_res, keep_input=True)
    return reply


def _deliver(msg: Message, context: Context, job: int, weight: float) -> Message:
    """The held update of ``job``, scaled by ``weight``, as this site's result (SecAgg+ masks
    it); the site holds nothing afterwards."""
    # FedBuff's weight, 1 / sqrt(1 + staleness), is in (0, 1]: anything else (NaN included)
    # would weigh this site's update out of the rule the run agreed
    if not 0.0 < weight <= 1.0:
        raise UpdateRejected(
            f"asked to send job {job}'s update at staleness weight {weight:g}, outside (0, 1]"
        )
    held = context.state.config_records.get(HELD_JOB_RECORD)
    if held is None or int(held["job"]) != job:
        holding = f"it holds job {int(held['job'])}'s" if held is not None else "it holds none"
        raise UpdateRejected(
            f"asked for the held update of job {job}, but {holding} (a site restarted since "
            "loses what it held)"
        )
    update = context.state.array_records[HELD_RECORD].to_numpy_ndarrays()
    del context.state.array_records[HELD_RECORD]
    del context.state.config_records[HELD_JOB_RECORD]
    scaled = [(weight * array).astype(array.dtype) for array in update]
    fit_res = FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters(scaled), int(held["num_examples"]),
        {HELD_METRIC: job},
    )  # fmt: skip
    return Message(compat.fitres_to_recorddict(fit_res, keep_input=True), reply_to=msg)
