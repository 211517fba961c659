"""Federated evaluation: sampled sites score the global model on their own evaluation data.

Flower 1.41's default evaluate workflow waits for the sites without a limit and reports a
site's error without the node that sent it. ``federated_evaluate_workflow`` sends the same
``evaluate`` messages, but closes at the round deadline and hands the strategy every outcome
bound to its site and to the message it answers: a reply, an error reply, or nothing by the
deadline (the strategy records those sampled sites ``late``). A site may get several
messages (cross-site evaluation: one per model); each result carries the model it scored.
It always calls the strategy's ``aggregate_evaluate``, even in a round no site evaluates,
because that is where the reporting strategy finishes the round.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, cast

from flwr.app import Message, MessageType
from flwr.common import Code, EvaluateIns, EvaluateRes, Status

from fedweave.contract import CROSS_SITE_MODEL_KEY, bounded_site_metrics, one_line
from fedweave.coordinator.rounds.deadlines import RoundDeadline
from fedweave.coordinator.rounds.secure_agg import SecAggSettings
from fedweave.coordinator.rounds.site_outcomes import SiteReplies
from fedweave.coordinator.rounds.site_weights import count_bound
from fedweave.flower_patches import message_records as compat
from fedweave.flower_patches.default_workflow import (
    MAIN_CONFIGS_RECORD,
    MAIN_PARAMS_RECORD,
    ClientProxy,
    Key,
)
from fedweave.history.records import SiteResult

log = logging.getLogger("fedweave.coordinator")

EvaluateOutcome = tuple[ClientProxy, EvaluateRes]

NOT_AVERAGED = frozenset({"seconds"})
"""Site figures kept per site but not averaged into the round's federated metrics."""
MAX_EVALUATION_WEIGHT = SecAggSettings().max_weight
"""A site's example count is its own word: in the round's mean it weighs in with at most this
many examples (SecAgg+'s cap on an update's weight), so one site claiming millions cannot
make the federation's figures its own (its claimed count is still recorded)."""


def is_evaluation_round(server_round: int, every: int, last_round: int) -> bool:
    """Whether sites evaluate after ``server_round`` (Flower's numbering): every ``every``
    rounds and after the last one; never with ``every`` 0."""
    if every <= 0:
        return False
    return server_round % every == 0 or server_round == last_round


def weighted_evaluation(results: Sequence[EvaluateOutcome]) -> dict[str, float]:
    """``loss`` and every numeric metric the sites returned, each averaged over the sites
    that reported it, weighted by their evaluation examples (at most
    ``MAX_EVALUATION_WEIGHT`` each, and at most ``site_weights.count_bound`` of all the
    counts: one site's claim cannot make the federation's figures its own)."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    bound = min(MAX_EVALUATION_WEIGHT, count_bound([float(r.num_examples) for _, r in results]))
    for _, res in results:
        n = min(float(res.num_examples), bound)
        if n <= 0:
            continue
        values: dict[str, Any] = {**res.metrics, "loss": res.loss}
        for name, value in values.items():
            if name in NOT_AVERAGED or isinstance(value, bool):
                continue
            if not isinstance(value, (int, float)):
                continue
            if not math.isfinite(float(value)):
                continue
            sums[name] = sums.get(name, 0.0) + float(value) * n
            weights[name] = weights.get(name, 0.0) + n
    return {name: sums[name] / weights[name] for name in sorted(sums)}


class UnknownSite:
    """The site of a failure Flower reported without its node."""

    node_id = "?"


OUTCOME_TAG = "fw-outcome"
"""A failed evaluation's metric: the status its site said (``refused``, ``failed``, ``lost``,
...), taken out again by ``site_evaluations``."""


def failed_outcome(
    proxy: Any, reason: str, status: str = "failed", metrics: dict[str, Any] | None = None
) -> EvaluateOutcome:
    """An evaluation that did not happen at ``proxy``'s site: ``status`` with ``reason`` (and
    ``metrics`` to record with it: the site's name, when it gave one)."""
    res = EvaluateRes(
        status=Status(code=Code.EVALUATE_NOT_IMPLEMENTED, message=reason),
        loss=0.0,
        num_examples=0,
        metrics={**(metrics or {}), OUTCOME_TAG: status},
    )
    return proxy, res


def _tag(res: EvaluateRes, model: Any) -> None:
    """Mark a cross-site result with the model it scored (``CROSS_SITE_MODEL_KEY``)."""
    if model is not None:
        res.metrics[CROSS_SITE_MODEL_KEY] = model


def evaluate_at_sites(
    grid: Any,
    instructions: Sequence[tuple[Any, EvaluateIns]],
    group_id: str,
    timeout: float,
    site_replies: SiteReplies | None = None,
) -> tuple[list[EvaluateOutcome], list[EvaluateOutcome]]:
    """Send each site its ``evaluate`` message and bind every answer by ``timeout`` to the
    message it answers: ``(results, failures)``, each ``(site, EvaluateRes)`` where ``site``
    is the instruction's own (anything with a ``node_id``); a failure's status says why.
    A cross-site result carries the model it scored (``CROSS_SITE_MODEL_KEY``); sites that
    said nothing by ``timeout`` are in neither list. ``site_replies``: where the run's grid
    notes what each site said, for the name of a site that failed."""
    from fedweave.contract import outcome_of

    results: list[EvaluateOutcome] = []
    failures: list[EvaluateOutcome] = []
    if not instructions:
        return results, failures
    messages = [
        Message(
            content=compat.evaluateins_to_recorddict(ins, True),
            dst_node_id=site.node_id,
            message_type=MessageType.EVALUATE,
            group_id=group_id,
        )
        for site, ins in instructions
    ]
    mark = site_replies.mark() if site_replies is not None else 0
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    # pushing gave each message its id: a reply names the one it answers
    sent = {
        message.metadata.message_id: (site, ins)
        for message, (site, ins) in zip(messages, instructions, strict=True)
    }
    for reply in replies:
        asked = sent.get(reply.metadata.reply_to_message_id)
        if asked is None or asked[0].node_id != reply.metadata.src_node_id:
            continue
        site, ins = asked
        model = ins.config.get(CROSS_SITE_MODEL_KEY)
        if reply.has_error():
            status, reason = outcome_of(int(reply.error.code), reply.error.reason)
            said = (
                site_replies.said(group_id, site.node_id, since=mark)
                if site_replies is not None
                else None
            )
            outcome = failed_outcome(site, reason, status, said.metrics() if said else None)
            _tag(outcome[1], model)
            failures.append(outcome)
            continue
        res = compat.recorddict_to_evaluateres(reply.content)
        res.metrics = bounded_site_metrics(res.metrics)  # a site's word, bounded
        _tag(res, model)
        if res.status.code == Code.OK:
            results.append((site, res))
        else:
            failures.append((site, res))
    return results, failures


def site_evaluations(
    results: Sequence[EvaluateOutcome],
    failures: Sequence[EvaluateOutcome],
    asked: Sequence[Any],
    expected_cross: Sequence[tuple[str, str]],
    late: str,
) -> tuple[list[SiteResult], list[SiteResult]]:
    """What the asked sites said, as history records: ``(evaluations, cross_site)``.

    Args:
        results / failures: ``evaluate_at_sites``'s outcomes.
        asked: the node ids asked to score the global model (silent ones are ``late``).
        expected_cross: (model, node id) of each cross-site message sent (silent: ``late``).
        late: the reason recorded for a site that said nothing in time.

    ``evaluations``: one per site asked to score the global model (ok with ``loss`` and its
    metrics, failed with the reason, or late). ``cross_site``: the global model's row (the
    same results, ``model`` "global") then one entry per (model, site) of ``expected_cross``;
    the model is in ``metrics["model"]``.
    """
    evaluations, matrix, seen = [], [], set()
    for site, res in [*results, *failures]:
        node, model = str(site.node_id), res.metrics.get(CROSS_SITE_MODEL_KEY)
        status = str(res.metrics.get(OUTCOME_TAG, "failed"))
        metrics = {
            k: v for k, v in res.metrics.items() if k not in (CROSS_SITE_MODEL_KEY, OUTCOME_TAG)
        }
        ok = res.status.code == Code.OK
        entry = (
            SiteResult(node, "ok", int(res.num_examples), {"loss": float(res.loss), **metrics})
            if ok
            else SiteResult(node, status, metrics=metrics, reason=one_line(res.status.message))
        )
        if model is None:
            evaluations.append(entry)
        else:
            seen.add((str(model), node))
            entry.metrics = {**entry.metrics, "model": str(model)}
            matrix.append(entry)
    answered = {site.site_id for site in evaluations}
    evaluations += [
        SiteResult(str(node), "late", reason=late) for node in asked if str(node) not in answered
    ]
    matrix += [
        SiteResult(node, "late", metrics={"model": model}, reason=late)
        for model, node in expected_cross
        if (model, node) not in seen
    ]
    global_row = [
        SiteResult(site.site_id, site.status, site.num_examples,
                   {**site.metrics, "model": "global"}, reason=site.reason)
        for site in evaluations
    ]  # fmt: skip
    return evaluations, global_row + matrix


def federated_evaluate_workflow(deadline: RoundDeadline, site_replies: SiteReplies | None = None):
    """The evaluate step of each round, closing ``deadline.seconds`` after its messages go
    out (see the module docstring); ``site_replies`` as for ``evaluate_at_sites``."""

    def evaluate_workflow(grid, context) -> None:
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        current_round = cast(int, cfg[Key.CURRENT_ROUND])
        parameters = compat.arrayrecord_to_parameters(
            context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
        )
        instructions = context.strategy.configure_evaluate(
            server_round=current_round,
            parameters=parameters,
            client_manager=context.client_manager,
        )
        results, failures = evaluate_at_sites(
            grid, instructions, str(current_round), deadline.seconds, site_replies
        )
        context.strategy.aggregate_evaluate(current_round, results, failures)

    return evaluate_workflow
