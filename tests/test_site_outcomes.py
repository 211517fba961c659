"""A site's outcome travels as data bound to its node: the site's outermost mod turns what its
code raised into an outcome reply with a code, a reason and the site's name
(``fedweave.contract``), the run's grid notes each outcome under its round and node
(``coordinator/rounds/site_outcomes.py``), and the reporting strategy records what each sampled site
said, or ``late`` for a silent one.

Flower's real ``Message``, ``Error`` and legacy record layout throughout; the grid under
``OutcomeGrid`` is a stand-in that answers as the SuperLink would (a real deployment's round
with every outcome is ``test_deploy_outcomes.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Error, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import Code, EvaluateIns, FitIns, FitRes, Parameters, Status
from flwr.common.constant import ErrorCode
from flwr.compat.common import recorddict_compat as compat
from flwr.server.strategy import FedAvg

from fedweave.client.mods import answering_outcomes
from fedweave.contract import (
    SITE_FAILED_CODE,
    SITE_NAME_METRIC,
    LateWork,
    SiteRefusal,
    UpdateRejected,
    one_line,
    outcome_content,
    outcome_of,
    read_outcome,
)
from fedweave.coordinator.rounds.reporting import ReportingStrategy
from fedweave.coordinator.rounds.site_outcomes import (
    OutcomeGrid,
    SiteReplies,
    SiteSaid,
    failure_said,
)
from fedweave.history.records import SiteResult

ROUND = "3"


def instruction(node: int, content: RecordDict | None = None, kind: str = MessageType.TRAIN):
    """An instruction to ``node`` in round ``ROUND`` as the SuperLink hands it back (id set)."""
    metadata = Metadata(
        run_id=1, message_id=f"m{node}", src_node_id=0, dst_node_id=node,
        reply_to_message_id="", group_id=ROUND, created_at=0.0, ttl=60.0, message_type=kind,
    )  # fmt: skip
    if content is None:
        content = compat.fitins_to_recorddict(
            FitIns(Parameters([], "numpy.ndarray"), {"round": 3}), keep_input=True
        )
    return Message(content=content, metadata=metadata)


def fit_result(num_examples: int = 10) -> RecordDict:
    res = FitRes(Status(Code.OK, "Success"), Parameters([], "numpy.ndarray"), num_examples, {})
    return compat.fitres_to_recorddict(res, keep_input=True)


def test_each_code_reads_as_its_status_and_an_unknown_one_is_a_malformed_reply():
    assert outcome_of(SiteRefusal.code, "wrong task\nsecond line") == ("refused", "wrong task")
    assert outcome_of(UpdateRejected.code, "not finite") == ("rejected", "not finite")
    assert outcome_of(LateWork.code, "too slow") == ("late", "too slow")
    assert outcome_of(SITE_FAILED_CODE, "RuntimeError: disk full") == (
        "failed", "RuntimeError: disk full",
    )  # fmt: skip
    assert outcome_of(ErrorCode.NODE_UNAVAILABLE, "node went away")[0] == "lost"
    assert outcome_of(ErrorCode.CLIENT_APP_CRASHED, "worker exited") == ("failed", "worker exited")
    assert outcome_of(4242, "whatever it says") == (
        "failed", "malformed reply: unknown outcome code 4242",
    )  # fmt: skip
    assert outcome_of(SiteRefusal.code, None) == ("refused", "no reason given")
    assert len(one_line("x" * 5000)) == 300 and one_line("a\x1b[31mb") == "a?[31mb"


@pytest.mark.parametrize(
    "raised, code, reason",
    [
        (SiteRefusal("site holds task 'a' but the run trains 'b'"), SiteRefusal.code,
         "site holds task 'a' but the run trains 'b'"),
        (UpdateRejected("update has non-finite values"), UpdateRejected.code,
         "update has non-finite values"),
        (LateWork("simulated straggler"), LateWork.code, "simulated straggler"),
        (RuntimeError("injected fault\nTraceback ..."), SITE_FAILED_CODE,
         "RuntimeError: injected fault"),
    ],
)  # fmt: skip
def test_the_sites_outermost_mod_answers_what_its_code_raised_as_a_coded_outcome(
    raised, code, reason
):
    asked = instruction(7)

    def call_next(msg, context):
        raise raised

    mod = answering_outcomes(lambda context: "hospital-a")
    reply = mod(asked, SimpleNamespace(), call_next)
    assert not reply.has_error() and read_outcome(reply.content) == (code, reason, "hospital-a")
    assert reply.metadata.reply_to_message_id == "m7" and reply.metadata.src_node_id == 7


def test_the_sites_outermost_mod_passes_a_result_through():
    asked = instruction(7)
    result = Message(fit_result(), reply_to=asked)
    mod = answering_outcomes(lambda context: None)
    assert mod(asked, SimpleNamespace(), lambda msg, ctx: result) is result


class _Grid:
    """Answers each instruction with what ``answers`` says for its node (None: silent)."""

    def __init__(self, answers):
        self.answers = answers

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            answer = self.answers[message.metadata.dst_node_id]
            if answer is None:
                continue
            replies.append(Message(answer, reply_to=message))
        return replies


def test_every_outcome_is_recorded_against_the_site_that_said_it():
    """One site ok, one refusing, one rejecting its own update, one failing, one lost by the
    SuperLink, one with an unknown code, one whose result is malformed, one silent: each is
    recorded under its own node, whatever order the replies come in."""
    malformed = fit_result()
    del malformed.metric_records["fitres.num_examples"]
    answers = {
        11: fit_result(),
        12: outcome_content(SiteRefusal.code, "site holds task 'a' but the run trains 'b'", "a"),
        13: outcome_content(UpdateRejected.code, "update has non-finite values", "b"),
        14: outcome_content(SITE_FAILED_CODE, "RuntimeError: injected fault", None),
        15: Error(ErrorCode.NODE_UNAVAILABLE, "Node 15 is unavailable"),
        16: outcome_content(4242, "trust me", "d"),
        17: malformed,
        18: None,
        19: Error(SiteRefusal.code, "run 7: the bundle carries files"),  # the worker's refusal
    }
    replies = SiteReplies()
    grid = OutcomeGrid(_Grid(answers), replies)
    received = grid.send_and_receive([instruction(node) for node in reversed(answers)])
    assert len(received) == 8
    by_node = {reply.metadata.src_node_id: reply for reply in received}
    assert by_node[17].has_error() and "malformed reply" in by_node[17].error.reason
    assert not by_node[11].has_error()
    # every outcome reaches the workflow as an error reply, as Flower's workflows expect
    assert all(by_node[node].has_error() for node in (12, 13, 14, 15, 16, 17, 19))
    assert by_node[12].error.code == SiteRefusal.code

    # Flower's fit workflow: results for content replies, a bare exception per error reply
    reporting = ReportingStrategy(FedAvg(), evaluator=None, site_replies=replies)
    reporting._sampled = list(answers)
    reporting._sites = [SiteResult("11", "ok", 10)]  # what aggregate_fit records for a result
    reporting._record_failures(int(ROUND), [Exception(r.error) for r in received if r.has_error()])
    recorded = {
        int(site.site_id): (site.status, site.reason, site.metrics.get(SITE_NAME_METRIC))
        for site in reporting._sites
    }
    assert recorded == {
        11: ("ok", None, None),
        12: ("refused", "site holds task 'a' but the run trains 'b'", "a"),
        13: ("rejected", "update has non-finite values", "b"),
        14: ("failed", "RuntimeError: injected fault", None),
        15: ("lost", "Node 15 is unavailable", None),
        16: ("failed", "malformed reply: unknown outcome code 4242", "d"),
        17: ("failed", "malformed reply: no fitres.num_examples.num_examples", None),
        18: ("late", "no reply", None),
        19: ("refused", "run 7: the bundle carries files", None),
    }
    assert replies.said(ROUND, 18) is None and replies.said(4, 12) is None  # bound to its round


def test_a_reply_to_another_call_or_from_another_node_is_left_alone():
    replies = SiteReplies()
    asked = instruction(21)
    stranger = Message(outcome_content(SiteRefusal.code, "not me", "x"), reply_to=instruction(22))
    grid = OutcomeGrid(SimpleNamespace(send_and_receive=lambda m, timeout=None: [stranger]),
                       replies)  # fmt: skip
    assert grid.send_and_receive([asked]) == [stranger]
    assert replies.said(ROUND, 21) is None and replies.said(ROUND, 22) is None


def test_an_unknown_result_status_or_evaluation_without_loss_is_malformed():
    bad_status = fit_result()
    bad_status.config_records["fitres.status"]["code"] = 99
    evaluate = compat.evaluateins_to_recorddict(
        EvaluateIns(Parameters([], "numpy.ndarray"), {}), keep_input=True
    )
    no_loss = RecordDict()
    replies = SiteReplies()
    answers = {31: bad_status, 32: no_loss}
    grid = OutcomeGrid(_Grid(answers), replies)
    grid.send_and_receive([instruction(31), instruction(32, evaluate, MessageType.EVALUATE)])
    assert replies.said(ROUND, 31) == SiteSaid("failed", "malformed reply: unknown status code 99")
    assert replies.said(ROUND, 32) == SiteSaid(
        "failed", "malformed reply: no evaluateres.loss.loss"
    )


def test_an_outcome_record_without_its_fields_is_a_malformed_reply():
    from flwr.app import ConfigRecord

    no_code = RecordDict({"fedweave.outcome": ConfigRecord({"reason": "x"})})
    replies = SiteReplies()
    OutcomeGrid(_Grid({41: no_code}), replies).send_and_receive([instruction(41)])
    assert replies.said(ROUND, 41) == SiteSaid(
        "failed", "malformed reply: outcome without an integer code and a reason"
    )


def test_a_workflow_failure_without_its_node_still_reads_as_data():
    said = failure_said(Exception(Error(SiteRefusal.code, "no data file")))
    assert said == SiteSaid("refused", "no data file")
    assert failure_said(TimeoutError("grid timed out")) == SiteSaid(
        "failed", "TimeoutError: grid timed out"
    )


def test_a_sites_first_word_in_a_round_is_kept_and_old_rounds_are_forgotten():
    replies = SiteReplies()
    replies.note("1", 5, SiteSaid("rejected", "first"))
    replies.note("1", 5, SiteSaid("failed", "second"))  # SecAgg+ asks again in a later stage
    assert replies.said(1, 5) == SiteSaid("rejected", "first")
    for round_number in range(2, 20):
        replies.note(str(round_number), 5, SiteSaid("late", "x"))
    assert replies.said(1, 5) is None and replies.said(19, 5) is not None


def _with_count(content: RecordDict, name: str, count: float) -> RecordDict:
    content.metric_records[name]["num_examples"] = count
    return content


def test_a_count_that_is_not_a_whole_number_of_at_least_one_is_the_sites_rejection():
    """An insider's example count (NaN, negative, zero, fractional) failed the round's weighted
    mean and with it the run and every resume; it is now that site's ``rejected`` outcome, for
    training results, evaluations and SecAgg+'s masked-vector replies (whose vector then never
    enters the sum: the protocol treats the site as dropped), and the round goes on."""
    from flwr.common import EvaluateRes

    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    counts = {31: float("nan"), 32: -1e12, 33: 0, 34: 2.5, 35: 10, 36: float("inf")}
    answers = {
        node: _with_count(fit_result(), "fitres.num_examples", count)
        for node, count in counts.items()
    }
    evaluate = compat.evaluateins_to_recorddict(
        EvaluateIns(Parameters([], "numpy.ndarray"), {}), keep_input=True
    )
    answers[37] = _with_count(
        compat.evaluateres_to_recorddict(EvaluateRes(Status(Code.OK, ""), 0.5, 10, {})),
        "evaluateres.num_examples", float("nan"),
    )  # fmt: skip
    masked_stage = fit_result()
    masked_stage.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"stage": "collect"})
    answers[38] = _with_count(masked_stage, "fitres.num_examples", float("nan"))
    asked = [instruction(node) for node in counts]
    asked.append(instruction(37, evaluate, MessageType.EVALUATE))
    secagg_content = compat.fitins_to_recorddict(
        FitIns(Parameters([], "numpy.ndarray"), {}), keep_input=True
    )
    secagg_content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"stage": "collect"})
    asked.append(instruction(38, secagg_content))

    replies = SiteReplies()
    received = OutcomeGrid(_Grid(answers), replies).send_and_receive(asked)
    by_node = {reply.metadata.src_node_id: reply for reply in received}
    assert not by_node[35].has_error()
    rejected = {node for node, reply in by_node.items() if reply.has_error()}
    assert rejected == {31, 32, 33, 34, 36, 37, 38}
    assert all(by_node[node].error.code == UpdateRejected.code for node in rejected)
    said = {node: replies.said(ROUND, node) for node in rejected}
    assert {s.status for s in said.values()} == {"rejected"}
    assert said[31].reason == "example count nan is not a whole number of at least 1"
    assert said[32].reason == "example count -1e+12 is not a whole number of at least 1"

    # the round records each under its node and aggregates the one honest result
    reporting = ReportingStrategy(FedAvg(), evaluator=None, site_replies=replies)
    reporting._sampled = list(counts)
    reporting._sites = [SiteResult("35", "ok", 10)]
    reporting._record_failures(int(ROUND), [Exception(r.error) for r in received if r.has_error()])
    assert {s.site_id: s.status for s in reporting._sites} == {
        "35": "ok", "31": "rejected", "32": "rejected", "33": "rejected", "34": "rejected",
        "36": "rejected",
    }  # fmt: skip


def test_under_secagg_a_count_above_max_weight_is_refused_before_the_sum():
    """Issue 39's SecAgg+ insider claimed 500 x ``max_weight`` examples: Flower's mod scales
    the masked vector by count / ``max_weight`` and only warns. The coordinator sees the count
    in the clear and refuses it before unmasking; honest sites send at most ``max_weight``
    (``client/site_app.count_as_sent``). Evaluation counts are bounded where they are averaged
    (``site_weights.py``), not refused."""
    from flwr.common import EvaluateRes

    from fedweave.client.site_app import count_as_sent
    from fedweave.contract import SECAGG_MAX_WEIGHT_KEY
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    masked = fit_result()
    masked.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"stage": "collect"})
    answers = {
        41: _with_count(masked, "fitres.num_examples", 5_000_000),
        42: _with_count(fit_result(), "fitres.num_examples", 10_000),
        43: _with_count(
            compat.evaluateres_to_recorddict(EvaluateRes(Status(Code.OK, ""), 0.5, 10, {})),
            "evaluateres.num_examples", 10**7,
        ),
    }  # fmt: skip
    secagg_content = compat.fitins_to_recorddict(
        FitIns(Parameters([], "numpy.ndarray"), {}), keep_input=True
    )
    secagg_content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"stage": "collect"})
    evaluate = compat.evaluateins_to_recorddict(
        EvaluateIns(Parameters([], "numpy.ndarray"), {}), keep_input=True
    )
    asked = [
        instruction(41, secagg_content), instruction(42),
        instruction(43, evaluate, MessageType.EVALUATE),
    ]  # fmt: skip
    replies = SiteReplies()
    received = OutcomeGrid(_Grid(answers), replies, max_fit_count=10_000.0).send_and_receive(asked)
    by_node = {reply.metadata.src_node_id: reply for reply in received}
    assert by_node[41].has_error() and by_node[41].error.code == UpdateRejected.code
    assert replies.said(ROUND, 41) == SiteSaid(
        "rejected",
        "example count 5e+06 is above SecAgg+'s max_weight 10000, the most one site may "
        "weigh in with",
    )
    assert not by_node[42].has_error() and not by_node[43].has_error()
    unbounded = OutcomeGrid(_Grid(answers), SiteReplies()).send_and_receive(asked)
    assert not any(reply.has_error() for reply in unbounded)  # plain runs: site_weights.py

    assert count_as_sent(25_000, {SECAGG_MAX_WEIGHT_KEY: 10_000.0}) == 10_000
    assert count_as_sent(360, {SECAGG_MAX_WEIGHT_KEY: 10_000.0}) == 360
    assert count_as_sent(25_000, {}) == 25_000


def test_an_async_run_reads_a_count_that_is_not_a_whole_number_as_the_sites_rejection():
    from fedweave.coordinator.rounds.fedbuff import _fit_result

    for count in (float("nan"), -3, 0):
        content = _with_count(fit_result(), "fitres.num_examples", count)
        outcome = _fit_result(Message(content, reply_to=instruction(41)))
        assert outcome.status == "rejected" and outcome.res is None
        assert (
            outcome.reason == f"example count {float(count):g} is not a whole number of at least 1"
        )
    honest = _fit_result(Message(fit_result(), reply_to=instruction(41)))
    assert honest.res is not None and honest.res.num_examples == 10
