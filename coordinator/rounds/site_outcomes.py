"""What each site said, bound to the node that said it.

A site answers every message with a result or an outcome reply whose code says what happened
(``fedweave.contract``: refused, rejected, late, failed), whose reason says why and which
names the site; Flower's own error replies (a ClientApp that crashed, a node the SuperLink
lost) carry Flower's codes. Every workflow of a run sends through ``OutcomeGrid``, which
notes each outcome under its round and node in ``SiteReplies`` and hands the workflow an
error reply in its place (Flower's workflows pass errors to a strategy without their node).
The reporting strategy reads a silent-looking site's outcome there: what the site said, or,
when it said nothing, ``late``.

A reply whose content is not the result it was asked for (no fit or evaluation result, a
status code Flower does not know, a SecAgg+ masked vector that NumPy cannot read or that is
laid out otherwise than most sites' are) is turned into an error reply from the same site and
noted ``failed`` with ``malformed reply``, so a workflow never trips over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedweave.contract import (
    SITE_FAILED_CODE,
    SITE_NAME_METRIC,
    UpdateRejected,
    one_line,
    outcome_of,
    read_outcome,
)
from fedweave.learning.validation import count_problem

MAX_ROUNDS_KEPT = 8
"""Rounds whose outcomes are kept; a round's are read when it ends."""


@dataclass(frozen=True)
class SiteSaid:
    """One site's outcome in one round: ``status`` as the history records it (``refused``,
    ``rejected``, ``late``, ``failed`` or ``lost``), the reason (one line) and the name the
    site gave (``None``: none, or Flower spoke for it)."""

    status: str
    reason: str
    site_name: str | None = None

    def metrics(self) -> dict[str, str]:
        """The site's record's metrics: its name, for ``SiteNames``, when it gave one."""
        return {SITE_NAME_METRIC: self.site_name} if self.site_name else {}


class SiteReplies:
    """The outcomes of the error replies of the last ``MAX_ROUNDS_KEPT`` rounds, by round
    (Flower's group id, the round's number as text) and node, in the order they were noted.

    One round may ask a site several times (SecAgg+'s four stages, the round's evaluation,
    federated statistics before round 1), so a reader takes ``mark()`` before its exchange
    and asks for what a site said ``since`` then: its first word in that exchange.
    """

    def __init__(self) -> None:
        self._rounds: dict[str, dict[int, list[tuple[int, SiteSaid]]]] = {}
        self._noted = 0

    def mark(self) -> int:
        """A point in time: ``said(..., since=mark)`` ignores what was noted before it."""
        return self._noted

    def note(self, group_id: str, node_id: int, said: SiteSaid) -> None:
        """Note ``said`` as what ``node_id`` answered in round ``group_id``."""
        if group_id not in self._rounds:
            self._rounds[group_id] = {}
            while len(self._rounds) > MAX_ROUNDS_KEPT:
                del self._rounds[next(iter(self._rounds))]
        self._rounds[group_id].setdefault(int(node_id), []).append((self._noted, said))
        self._noted += 1

    def said(self, server_round: int | str, node_id: int, since: int = 0) -> SiteSaid | None:
        """What ``node_id`` first said in ``server_round`` (Flower's numbering) at or after
        ``since``, or None."""
        noted = self._rounds.get(str(server_round), {}).get(int(node_id), [])
        return next((said for serial, said in noted if serial >= since), None)


def failure_said(failure: BaseException) -> SiteSaid:
    """The outcome of a failure a Flower workflow reports without its node: the error reply
    it wraps (``Exception(message.error)``, structured), else the exception's type and line."""
    from flwr.app import Error

    error = failure.args[0] if failure.args else None
    if isinstance(error, Error):
        return SiteSaid(*outcome_of(int(error.code), error.reason))
    return SiteSaid("failed", one_line(f"{type(failure).__name__}: {failure}"))


_FIT_RESULT = (
    ("array_records", "fitres.parameters", None),
    ("metric_records", "fitres.num_examples", "num_examples"),
    ("config_records", "fitres.metrics", None),
    ("config_records", "fitres.status", "code"),
)
_EVALUATE_RESULT = (
    ("metric_records", "evaluateres.loss", "loss"),
    ("metric_records", "evaluateres.num_examples", "num_examples"),
    ("config_records", "evaluateres.metrics", None),
    ("config_records", "evaluateres.status", "code"),
)


def result_problem(asked: Any, reply: Any) -> str | None:
    """Why ``reply``'s content is not the fit or evaluation result ``asked`` (a plain fit or
    evaluate instruction in Flower's legacy record layout) calls for, or None. SecAgg+'s
    stage replies are checked by its own workflow."""
    from flwr.app import MessageType
    from flwr.common import Code

    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    kind = asked.metadata.message_type
    content = asked.content
    if kind == MessageType.EVALUATE and "evaluateins.config" in content.config_records:
        expected = _EVALUATE_RESULT
    elif (
        kind == MessageType.TRAIN
        and "fitins.config" in content.config_records
        and RECORD_KEY_CONFIGS not in content.config_records
    ):
        expected = _FIT_RESULT
    else:
        return None
    for records, name, key in expected:
        record = getattr(reply.content, records).get(name)
        if record is None or (key is not None and key not in record):
            return f"no {name}{'.' + key if key else ''}"
    status = reply.content.config_records[expected[-1][1]]["code"]
    if not isinstance(status, int) or status not in {code.value for code in Code}:
        return f"unknown status code {one_line(repr(status), 40)}"
    return None


def reported_count_problem(reply: Any, max_fit_count: float | None = None) -> str | None:
    """Why the example count a fit or evaluation result ``reply`` carries must be refused
    (``count_problem``; a fit count above ``max_fit_count``, when given), or None (also for
    replies without one). SecAgg+'s masked-vector replies carry the count in the clear too:
    refused there, the site's vector never enters the sum, and the protocol unmasks the others
    as if the site had dropped out."""
    for name in ("fitres.num_examples", "evaluateres.num_examples"):
        record = reply.content.metric_records.get(name)
        if record is not None and "num_examples" in record:
            count = record["num_examples"]
            problem = count_problem(count)
            if problem is None and name.startswith("fitres") and max_fit_count is not None:
                if count > max_fit_count:
                    return (
                        f"example count {float(count):g} is above SecAgg+'s max_weight "
                        f"{max_fit_count:g}, the most one site may weigh in with"
                    )
            return problem
    return None


def _fit_result_problem(reply: Any) -> str | None:
    """Why Flower's collect stage could not read ``reply`` (a reply to it with a masked vector)
    as a fit result (its legacy layout: parameters, count, metrics, status), or None; Flower
    would raise on it, ending everyone's round."""
    from fedweave.flower_patches import message_records as compat

    for records, name, key in _FIT_RESULT:
        record = getattr(reply.content, records).get(name)
        if record is None or (key is not None and key not in record):
            return f"no {name}{'.' + key if key else ''}"
    try:
        compat.recorddict_to_fitres(reply.content, keep_input=True)
    except Exception as exc:  # noqa: BLE001 - any way Flower's reader fails is the site's
        return f"a fit result Flower cannot read ({type(exc).__name__})"
    return None


def masked_vector_problems(answers: list[tuple[Any, Any]], held: Any = None) -> dict[int, str]:
    """``id(reply)`` → why its SecAgg+ masked vector cannot join the sum, for the
    ``(reply, asked)`` pairs of ``answers`` that answer SecAgg+'s collect stage: missing or
    malformed (``secagg_vectors.masked_vector_layout``), or laid out otherwise than more than
    half of the well-formed ones are (honest sites' vectors all share the layout of the
    round's model or statistics; with no such majority, none joins and the protocol's
    threshold decides whether the round goes on). ``held``: the coordinator's registry of
    vectors kept in its spool (``SpooledUpdates.vector_layout``), None where there is none."""
    from collections import Counter

    from fedweave.flower_patches.secagg_vectors import masked_vector_layout

    layouts = [
        (id(reply), _fit_result_problem(reply) or masked_vector_layout(reply, asked, held))
        for reply, asked in answers
        if asked is not None and masked_vector_layout(reply, asked, held) is not None
    ]
    layouts = [(key, layout) for key, layout in layouts if layout is not None]
    counts = Counter(layout for _key, layout in layouts if not isinstance(layout, str))
    common, count = counts.most_common(1)[0] if counts else (None, 0)
    majority = common if 2 * count > sum(counts.values()) else None
    problems = {}
    for key, layout in layouts:
        if isinstance(layout, str):
            problems[key] = layout
        elif layout != majority:
            shown = f"masked vector shaped {one_line(str(layout), 80)}"
            problems[key] = (
                f"{shown}; most of the round's sites sent {one_line(str(majority), 80)}"
                if majority is not None
                else f"{shown}; no layout is shared by most of the round's sites"
            )
    return problems


class OutcomeGrid:
    """A grid that notes every error reply's outcome in ``replies`` under its round and node,
    and turns a malformed result into an error reply (``result_problem``); everything else is
    the wrapped grid's.

    Parameters
    ----------
    grid : Grid
        The grid the ServerApp was given (or another wrapper around it).
    replies : SiteReplies
        Where the outcomes go; the reporting strategy reads them.
    traffic : Traffic | None (default: None)
        Where the bytes sent to and received from each site are counted
        (``fedweave/coordinator/rounds/traffic.py``); ``None``: not counted.
    max_fit_count : float | None (default: None)
        The most examples a fit result may claim: SecAgg+'s ``max_weight`` in a secure run,
        where a site's masked vector carries its weight and the coordinator cannot bound it
        after the sum (``site_weights.py`` bounds the plain runs' weights instead); a higher
        claim is the site's ``rejected`` outcome. ``None``: no bound.
    held : Callable | None (default: None)
        ``SpooledUpdates.vector_layout`` where SecAgg+'s masked vectors may be held in the
        transfer spool (``--bulk-address``): the layout of a vector held for a site; ``None``:
        a placeholder vector is refused.
    """

    def __init__(
        self,
        grid: Any,
        replies: SiteReplies,
        traffic: Any | None = None,
        max_fit_count: float | None = None,
        held: Any = None,
    ) -> None:
        self._grid, self.replies, self.traffic = grid, replies, traffic
        self.max_fit_count = max_fit_count
        self.held = held

    def send_and_receive(self, messages, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        messages = list(messages)
        if self.traffic is not None:
            for message in messages:
                self.traffic.sent(message)
        received = list(self._grid.send_and_receive(messages, timeout=timeout))
        # pushing gave each message its id: a reply names the one it answers
        sent = {message.metadata.message_id: message for message in messages}
        asked_by = [(reply, sent.get(reply.metadata.reply_to_message_id)) for reply in received]
        vectors = masked_vector_problems(asked_by, self.held)
        replies = []
        for reply, asked in asked_by:
            if self.traffic is not None and asked is not None:
                self.traffic.received(reply, asked)
            replies.append(self._noted(reply, asked, vectors.get(id(reply))))
        return replies

    def _noted(self, reply: Any, asked: Any, vector_problem: str | None = None):  # type: ignore[no-untyped-def]
        from flwr.app import Error, Message

        if asked is None or asked.metadata.dst_node_id != reply.metadata.src_node_id:
            return reply  # answers nothing this call sent: the workflow ignores it too
        group_id, node_id = asked.metadata.group_id, asked.metadata.dst_node_id
        if reply.has_error():  # Flower's own, or a foreign bundle the site's worker refused
            status, reason = outcome_of(int(reply.error.code), reply.error.reason)
            self.replies.note(group_id, node_id, SiteSaid(status, reason))
            return reply
        outcome = read_outcome(reply.content)
        if outcome is not None:  # what the site's code raised: an error for the workflow
            code, said, site_name = outcome
            status, reason = outcome_of(code, said)
            self.replies.note(group_id, node_id, SiteSaid(status, reason, site_name))
            return Message(Error(code=code, reason=reason), reply_to=asked)
        problem = result_problem(asked, reply)
        if problem is not None:
            reason = f"malformed reply: {problem}"
            self.replies.note(group_id, node_id, SiteSaid("failed", reason))
            return Message(Error(code=SITE_FAILED_CODE, reason=reason), reply_to=asked)
        problem = reported_count_problem(reply, self.max_fit_count)
        if problem is not None:  # an insider's count would weigh the mean, or fail it
            self.replies.note(group_id, node_id, SiteSaid("rejected", problem))
            return Message(Error(code=UpdateRejected.code, reason=problem), reply_to=asked)
        if vector_problem is not None:  # Flower's sum would raise, halting everyone's round
            reason = f"malformed reply: {vector_problem}"
            self.replies.note(group_id, node_id, SiteSaid("failed", reason))
            return Message(Error(code=SITE_FAILED_CODE, reason=reason), reply_to=asked)
        return reply

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._grid, name)
