"""The site mod that compresses a trained update when the run asks (``--compress``).

It sits outside the update check and DP (so it compresses what they passed: the update the
site would have sent) and inside the console line (which then says how many bytes left).
What compression dropped is kept in the site's run state (``context.state``, which Flower
keeps per run and site across messages) and added to the next round's update: error
feedback. A site restarted mid-run starts again without it; nothing else is lost.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from fedweave.contract import (
    COMPRESS_KEY,
    COMPRESSION_METRIC,
    PRIVATE_EVALUATION_KEY,
    STATISTICS_STAGE_KEY,
    SiteRefusal,
)
from fedweave.errors import UserError
from fedweave.flower_patches import message_records as compat
from fedweave.flower_patches.message_records import ClientAppCallable
from fedweave.learning.compression import Compression

RESIDUAL_RECORD = "fedweave.compression-residual"
"""``context.state.array_records`` key of the error this site kept from earlier rounds."""


def compression_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The site's update, compressed as the round's ``COMPRESS_KEY`` says; other messages, and
    rounds without it, pass through."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    record = msg.content.config_records.get("fitins.config")
    spec = record.get(COMPRESS_KEY) if record is not None else None
    if not spec or record.get(STATISTICS_STAGE_KEY) or record.get(PRIVATE_EVALUATION_KEY):
        return call_next(msg, context)
    try:
        compression = Compression.parse(str(spec))
    except UserError as exc:
        raise SiteRefusal(f"{exc}; this site's fedweave does not know it: upgrade it") from None
    reply = call_next(msg, context)
    if reply.has_error() or not reply.content.array_records or not compression.active:
        return reply
    fit_ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    fit_res = compat.recorddict_to_fitres(reply.content, keep_input=True)
    kept = context.state.array_records.get(RESIDUAL_RECORD)
    residual = kept.to_numpy_ndarrays()[0] if kept is not None else None
    sent, residual = compression.encode(
        parameters_to_ndarrays(fit_res.parameters), parameters_to_ndarrays(fit_ins.parameters),
        residual,
    )  # fmt: skip
    context.state.array_records[RESIDUAL_RECORD] = ArrayRecord([np.ascontiguousarray(residual)])
    fit_res.parameters = ndarrays_to_parameters(sent)
    fit_res.metrics[COMPRESSION_METRIC] = compression.spec
    reply.content = compat.fitres_to_recorddict(fit_res, keep_input=True)
    return reply
