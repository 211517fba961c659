"""Client mods that run at the site around the ClientApp.

``answering_outcomes`` is outermost: whatever the site's code raises becomes an outcome reply
whose code says what happened (refused, rejected, late, failed: ``fedweave.contract``), whose
reason says why and which names the site, so the coordinator reads it as data bound to this
site.

``version_guard`` comes next: a deployed run whose coordinator runs another fedweave or Flower
release line than this site (``fedweave.versions``) is refused before anything of it is read,
with both sides' versions and the fix.

``stale_round_guard`` then: a message of a round older than the newest this site has
seen (it arrives after its round's deadline, say a site that was stalled) is refused before
SecAgg+ could mix it into the state of the round in progress.

``clock_guard`` refuses a round's training instruction when this site's clock is further from
the coordinator's than ``--max-clock-skew`` allows, with the difference it measured.

``privacy_floor`` refuses a training message below the site's own privacy floor
(``fedweave client --require-secure-agg``, ``--require-dp``, ``--max-epsilon``), before the
site trains, with the setting named.

``update_check_mod`` sits inside ``secaggplus_mod`` (so it sees the plaintext update before
it is masked): it refuses an invalid update, which makes the site a dropout that SecAgg+
recovers from, and it reports values that SecAgg+ would clip instead of letting them
silently distort the model.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message, MessageType

from fedweave.bulk.records import parameter_views
from fedweave.client.bulk_mod import bulk_transfers
from fedweave.client.compression_mod import compression_when_asked
from fedweave.client.downlink_mod import downlink_restored
from fedweave.client.held_updates import holding_updates_when_asked
from fedweave.client.local_dp import LEDGER as LOCAL_LEDGER
from fedweave.client.local_dp import LocalLedger, local_dp_when_asked, local_noise
from fedweave.contract import (
    CLIPPED_FRACTION_METRIC,
    COMPRESSION_METRIC,
    DELIVER_KEY,
    DELIVERY_ALLOWANCE_KEY,
    DP_DELTA_KEY,
    DP_EPSILON_AFTER_KEY,
    DP_MODE_KEY,
    HELD_METRIC,
    HOLD_KEY,
    LOCAL_DP_KEYS,
    MAX_CLOCK_SKEW_KEY,
    MAX_NORM_KEY,
    NODE_MAX_DELTA_KEY,
    NODE_MAX_EPSILON_KEY,
    NODE_POLICY_KEY,
    NODE_REQUIRE_DP_KEY,
    NODE_REQUIRE_SECURE_AGG_KEY,
    NODE_SITE_NAME_KEY,
    PRIVATE_EVALUATION_KEY,
    PROCESSES_METRIC,
    ROUND_KEY,
    RUN_ID_KEY,
    RUN_OPERATOR_KEY,
    RUN_TASK_KEY,
    RUN_VERSIONS_KEY,
    SAMPLE_DP_KEYS,
    SECAGG_CLIP_KEY,
    SECAGG_MAX_WEIGHT_KEY,
    SECAGG_VECTOR_ARRAYS_KEY,
    STATISTICS_STAGE_KEY,
    LateWork,
    SiteOutcome,
    SiteRefusal,
    UpdateRejected,
    outcome_content,
    outcome_of,
)
from fedweave.flower_patches import message_records as compat
from fedweave.flower_patches.message_records import ClientAppCallable, Mod
from fedweave.learning.validation import clipped_fraction, update_problem

log = logging.getLogger("fedweave.client")


SiteNameOf = Callable[[Context], str | None]
"""This site's name for a message's context (``None``: it has none)."""


def node_site_name(context: Context) -> str | None:
    """A deployed site's name: ``fedweave client --name`` in its node config."""
    name = context.node_config.get(NODE_SITE_NAME_KEY)
    return str(name) if name else None


def answering_outcomes(site_name_of: SiteNameOf) -> Mod:
    """The outermost site mod: ``call_next``'s reply, or, when the site's code raises, an
    outcome reply (``fedweave.contract.outcome_content``) with the outcome's code
    (``SiteOutcome``: refused, rejected, late; anything else: failed, with its type), its
    reason on one line and this site's name (``site_name_of``), so the coordinator records
    it under the right site even when it never sent a result."""

    def site_outcome_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        try:
            return call_next(msg, context)
        except SiteOutcome as exc:
            code, reason = exc.code, str(exc)
        except Exception as exc:  # the task's own failure: said to the coordinator, logged here
            log.error("message of round %s failed", msg.metadata.group_id or "-", exc_info=exc)
            code, reason = SiteOutcome.code, f"{type(exc).__name__}: {exc}"
        status, said = outcome_of(code, reason)
        site_record(msg, outcome=status, reason=said)
        return Message(outcome_content(code, reason, site_name_of(context)), reply_to=msg)

    return site_outcome_mod


STALE_ROUND_RECORD = "fedweave.site"
NEWEST_ROUND_KEY = "newest-round"
_VERSION_REFUSALS_SAID: set[tuple[int, str]] = set()


def version_guard(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Refuse every message of a deployed run (one a fedweave coordinator started: it names
    its history run) whose coordinator this site cannot speak to (``versions.mismatch``); the
    site's console says so once a run. A simulation's sites share its process: not checked."""
    from fedweave.versions import mismatch

    if RUN_ID_KEY not in context.run_config:
        return call_next(msg, context)
    said = context.run_config.get(RUN_VERSIONS_KEY)
    problem = mismatch(str(said) if said is not None else None)
    if problem is None:
        return call_next(msg, context)
    if (msg.metadata.run_id, problem) not in _VERSION_REFUSALS_SAID:
        _VERSION_REFUSALS_SAID.add((msg.metadata.run_id, problem))
        SITE_CONSOLE.warning("refused the coordinator's run (Flower run %s): %s",
                             msg.metadata.run_id, problem)  # fmt: skip
    raise SiteRefusal(problem)


def stale_round_guard(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Refuse a message of a round older than the newest one this site has taken part in."""
    from flwr.app import ConfigRecord

    try:
        round_number = int(msg.metadata.group_id)
    except (TypeError, ValueError):
        return call_next(msg, context)  # not a round's message (no group id)
    record = context.state.config_records.get(STALE_ROUND_RECORD)
    newest = int(record[NEWEST_ROUND_KEY]) if record is not None else 0
    if round_number < newest:
        log.warning("dropped a late message of round %s (now in round %s)", round_number, newest)
        raise LateWork(
            f"late message of round {round_number} refused: this site is in round {newest}"
        )
    context.state.config_records[STALE_ROUND_RECORD] = ConfigRecord(
        {NEWEST_ROUND_KEY: round_number}
    )
    return call_next(msg, context)


def clock_problem(lag: float, max_skew: float, allowance: float) -> str | None:
    """Why this site's clock is too far from the coordinator's, or None.

    ``lag`` is this site's clock when an instruction arrived minus the coordinator's clock
    when it created it: the clock difference plus a delivery delay between 0 and
    ``allowance`` seconds. So a lag below ``-max_skew`` proves the site's clock is behind by
    more than ``max_skew``, and one above ``max_skew + allowance`` proves it is ahead.
    """
    fix = "synchronise it (NTP: chrony or systemd-timesyncd) and it takes part again"
    if lag < -max_skew:
        return (
            f"this site's clock is {-lag:.0f} s behind the coordinator's (at most "
            f"{max_skew:g} s allowed); {fix}"
        )
    if lag > max_skew + allowance:
        return (
            f"this site's clock is at least {lag - allowance:.0f} s ahead of the "
            f"coordinator's (at most {max_skew:g} s allowed); {fix}"
        )
    return None


def clock_guard(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Refuse a round's training instruction while this site's clock is off (``clock_problem``)."""
    arrived = time.time()
    config = _fit_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
    if config is None or MAX_CLOCK_SKEW_KEY not in config:
        return call_next(msg, context)
    problem = clock_problem(
        arrived - msg.metadata.created_at,
        float(config[MAX_CLOCK_SKEW_KEY]),
        float(config.get(DELIVERY_ALLOWANCE_KEY, 0.0)),
    )
    if problem is not None:
        log.warning("round refused: %s", problem)
        raise SiteRefusal(problem)
    return call_next(msg, context)


FLOOR_KEYS = (
    NODE_REQUIRE_SECURE_AGG_KEY, NODE_REQUIRE_DP_KEY, NODE_MAX_EPSILON_KEY, NODE_MAX_DELTA_KEY,
)  # fmt: skip
"""The node-config entries of a site's privacy floor (``fedweave client``'s ``privacy_floor``)."""
REQUIRED_DP = {
    "any": ("central", "local", "sample"),
    "local": ("local", "sample"),
    "sample": ("sample",),
}
"""``--require-dp`` → the run mechanisms it accepts (``local``: this site adds the noise)."""


def _round_delta(config: dict, mode: str) -> float | None:
    """The delta a DP round's epsilon is stated at, from the mechanism's own settings."""
    key = {"local": LOCAL_DP_KEYS[3], "sample": SAMPLE_DP_KEYS[2]}.get(mode, DP_DELTA_KEY)
    try:
        return float(config[key]) if key in config else None
    except (TypeError, ValueError):
        return math.inf


def floor_problem(
    floor: dict, config: dict, secure: bool, run_id: int = 0, ledger: LocalLedger = LOCAL_LEDGER
) -> str | None:
    """Why this site's privacy ``floor`` (its node config: ``--require-secure-agg``,
    ``--require-dp``, ``--max-epsilon``) refuses a training message with fit ``config``;
    ``secure``: the message carries SecAgg+'s own records (checked on the message itself, not
    on the coordinator's word). ``None``: the floor holds.

    SecAgg+ covers everything a training message sends (statistics, updates, private
    evaluation); an update held for a later SecAgg+ buffer sends nothing now. The DP floor
    covers model updates and refuses the statistics exchange (not a DP release: a DP run
    never asks for it); evaluation is not covered. Under local DP the site computes its own
    noise and epsilon (``client/local_dp.py``; ``run_id``'s releases at this site) and refuses
    a round that asks for none; under sample DP its own ledger decides ``--max-epsilon``
    (``site_app.py``); only under central DP, where the coordinator adds the noise, does the
    floor rest on the coordinator's stated ledger. ``--max-delta`` caps every mode's delta."""
    fix = "restart this site without that floor to take part"
    if str(floor.get(NODE_REQUIRE_SECURE_AGG_KEY, "")).lower() == "true":
        if not secure and not config.get(HOLD_KEY):
            return (
                "this site requires secure aggregation (--require-secure-agg), but the run "
                f"sends its updates unmasked; run the coordinator with SecAgg+, or {fix}"
            )
    required = str(floor.get(NODE_REQUIRE_DP_KEY, "off"))
    if STATISTICS_STAGE_KEY in config:
        named = [f"--require-dp {required}"] if required != "off" else []
        if floor.get(NODE_MAX_EPSILON_KEY) is not None:
            named.append(f"--max-epsilon {float(floor[NODE_MAX_EPSILON_KEY]):g}")
        if named:
            return (
                f"this site requires differential privacy ({', '.join(named)}), but the run "
                "asks for statistics of its data, which no DP ledger covers (a DP run scales "
                "with the task's declared bounds instead); run the coordinator with --dp, or "
                f"{fix}"
            )
        return None
    if PRIVATE_EVALUATION_KEY in config:
        return None
    mode = str(config.get(DP_MODE_KEY, "none"))
    accepted = REQUIRED_DP.get(required)
    if accepted is not None and mode not in accepted:
        return (
            f"this site requires differential privacy (--require-dp {required}), but the run "
            f"has --dp {mode}; run the coordinator with --dp {' or '.join(accepted)}, or {fix}"
        )
    noise, problem = local_noise(config) if mode == "local" else (None, None)
    if problem is not None:
        return f"{problem}; this site adds local DP noise only as it computes it"
    if mode == "local" and noise is None and required in ("any", "local"):
        return (
            f"this site requires differential privacy (--require-dp {required}), but the run's "
            "round asks for local DP without its settings: no noise; run the coordinator "
            "with --dp local and a --dp-epsilon"
        )
    delta_cap = floor.get(NODE_MAX_DELTA_KEY)
    delta = _round_delta(config, mode)
    if delta_cap is not None and delta is not None and delta > float(delta_cap):
        return (
            f"this site allows at most delta {float(delta_cap):g} (--max-delta), but the run "
            f"asks for delta {delta:g}; run the coordinator with --dp-delta "
            f"{float(delta_cap):g} or below, or {fix}"
        )
    budget = floor.get(NODE_MAX_EPSILON_KEY)
    if budget is None or mode == "sample":  # sample: the site's own ledger (site_app.py)
        return None
    budget = float(budget)
    if noise is not None:  # local: the site's own account of the noise it adds
        stated = config.get(DP_EPSILON_AFTER_KEY)
        after = ledger.epsilon(run_id, noise.delta, noise.multiplier)
        if after <= budget:
            return None
        return (
            f"this site allows at most epsilon {budget:g} (--max-epsilon), but its own noise "
            f"(clipping norm {noise.clipping_norm:g}, sensitivity {noise.sensitivity:g}, "
            f"multiplier {noise.multiplier:.4g}) would take its ledger for this run to "
            f"{after:.3f} at delta {noise.delta:g} (the coordinator states "
            + (f"{float(stated):.3f}" if isinstance(stated, (int, float)) else "nothing")
            + f", sensitivity {noise.stated_sensitivity:g}); {fix}, or give the run less epsilon"
        )
    if mode not in ("central", "local"):
        return (
            f"this site allows at most epsilon {budget:g} (--max-epsilon), but the run has no "
            f"differential privacy; run the coordinator with --dp central, local or sample, "
            f"or {fix}"
        )
    after = float(config.get(DP_EPSILON_AFTER_KEY, math.inf))
    if not after <= budget:
        return (
            f"this site allows at most epsilon {budget:g} (--max-epsilon), but this round "
            f"would take the run's ledger to {after:.3f} (delta "
            f"{float(config.get(DP_DELTA_KEY, 0)):g}); {fix}, or give the run --max-epsilon"
        )
    return None


_POLICIES: dict[str, object] = {}
"""Policy file path → its ``site_policy.PolicyFile`` (read again when it changes)."""
_POLICY_REFUSALS_SAID: set[tuple[int, str]] = set()
"""(Flower run, reason) already said on the site's console: once a run, not once a round."""


def _site_policy(context: Context):  # type: ignore[no-untyped-def]
    """This site's policy (``fedweave client --policy``) as its file says now, or None;
    ``SiteRefusal`` with its problem where the file no longer reads."""
    from fedweave.errors import UserError
    from fedweave.site_policy import PolicyFile

    path = context.node_config.get(NODE_POLICY_KEY)
    if not path:
        return None
    policy_file = _POLICIES.setdefault(str(path), PolicyFile(Path(str(path))))
    try:
        return policy_file.current()  # type: ignore[attr-defined]
    except UserError as exc:
        raise SiteRefusal(f"{exc}; the site refuses every run until it is fixed") from None


def site_policy_guard(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Refuse every message of a run this site's policy does not take (its task, the operator
    who submitted it, the hour: ``site_policy.SitePolicy.refusal``), before anything of the
    message is read; the site's console says so once a run. A training job asking more of
    the site's time than its policy allows (``job_refusal``) is refused alone."""
    policy = _site_policy(context)
    if policy is None:
        return call_next(msg, context)
    operator = context.run_config.get(RUN_OPERATOR_KEY)
    problem = policy.refusal(
        str(context.run_config.get(RUN_TASK_KEY, "")), str(operator) if operator else None
    )
    if problem is None:
        config = _fit_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
        job = policy.job_refusal(config) if config is not None else None
        if job is not None:
            log.warning("round refused: %s", job)
            raise SiteRefusal(job)
        return call_next(msg, context)
    said = (msg.metadata.run_id, problem)
    if said not in _POLICY_REFUSALS_SAID:
        _POLICY_REFUSALS_SAID.add(said)
        who = f"operator {operator}'s study" if operator else "the coordinator's run"
        SITE_CONSOLE.warning(
            "refused %s (Flower run %s, task %s): %s", who, msg.metadata.run_id,
            context.run_config.get(RUN_TASK_KEY, "?"), problem,
        )  # fmt: skip
    raise SiteRefusal(problem)


def privacy_floor(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Refuse a training message below this site's privacy floor (``floor_problem``): its
    flags' and its policy file's, the stricter of the two."""
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS

    config = _fit_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
    if config is None:
        return call_next(msg, context)
    floor = {k: v for k, v in context.node_config.items() if k in FLOOR_KEYS}
    policy = _site_policy(context)
    if policy is not None:
        floor = policy.floor(floor, FLOOR_KEYS)
    secure = RECORD_KEY_CONFIGS in msg.content.config_records
    problem = floor_problem(floor, config, secure, msg.metadata.run_id)
    if problem is not None:
        log.warning("round refused: %s", problem)
        raise SiteRefusal(problem)
    return call_next(msg, context)


SITE_CONSOLE = logging.getLogger("fedweave.site.console")
"""What the site's operator should see of each round (the deployed worker prints it on the
site's console; in a simulation nobody attaches a handler, so it stays quiet)."""

SITE_RECORDS = logging.getLogger("fedweave.site.records")
SITE_RECORDS.propagate = False
"""The same as data, one ``site_record`` per message this site answered (the deployed worker
hands them to ``fedweave client``'s status view; in a simulation they go nowhere)."""


def site_record(msg: Message, **fields: object) -> None:
    """Note what this site did with ``msg``: its kind, run and round, then ``fields``
    (``outcome``, ``examples``, ``metrics``, ``sent``, ``reason``)."""
    if not SITE_RECORDS.isEnabledFor(logging.INFO):
        return
    kind = {MessageType.TRAIN: "train", MessageType.EVALUATE: "evaluate"}.get(
        msg.metadata.message_type, str(msg.metadata.message_type)
    )
    record = {"kind": kind, "run": msg.metadata.run_id, "round": msg.metadata.group_id or None,
              **fields}  # fmt: skip
    SITE_RECORDS.info("%s", kind, extra={"site_record": record})


def _numbers(metrics: dict) -> dict[str, float]:
    return {
        str(name): float(value) for name, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }  # fmt: skip


def _metrics_line(metrics: dict) -> str:
    shown = [
        f"{name.removeprefix('train_')} {float(value):.4g}"
        for name, value in sorted(metrics.items())
        if name.startswith("train_")
    ]
    return ", ".join(shown)


def _said_if_it_fails(
    msg: Message, context: Context, call_next: ClientAppCallable, prefix: str
) -> Message:
    """``call_next``; an exception is also said on the site's console (its first line after
    ``prefix``, whose ``{status}`` becomes the word the coordinator records it by: refused,
    rejected, failed) before it goes on to Flower, which reports it to the coordinator."""
    try:
        return call_next(msg, context)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        status = getattr(exc, "status", "failed")
        SITE_CONSOLE.warning("%s%s", prefix.replace("{status}", str(status)), text)
        raise


def site_console_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """One console line per round for this site: what it trained and sent, or why its work
    was refused or rejected here (the coordinator learns the same from the reply)."""
    if msg.metadata.message_type == MessageType.EVALUATE:
        return _evaluation_line(msg, context, call_next)
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    round_label = _round_label(msg, context)
    reply = _said_if_it_fails(msg, context, call_next, f"round {round_label}: ")
    if reply.has_error() or not reply.content.array_records:
        return reply  # a SecAgg+ key stage, or an error already reported
    # Read in place (Flower's legacy record layout): a FitRes conversion would copy the model.
    config = dict(msg.content.config_records.get("fitins.config") or {})
    counts = reply.content.metric_records.get("fitres.num_examples") or {}
    num_examples = int(counts.get("num_examples", 0))
    metrics = dict(reply.content.config_records.get("fitres.metrics") or {})
    sent = "masked (SecAgg+)" if SECAGG_CLIP_KEY in config else "in the clear"
    if metrics.get(COMPRESSION_METRIC):
        sent = f"in the clear, {metrics[COMPRESSION_METRIC]}-compressed ({_sent_bytes(reply)})"
    stage = config.get(STATISTICS_STAGE_KEY)
    masked = SECAGG_CLIP_KEY in config
    if DELIVER_KEY in config:
        SITE_CONSOLE.info(
            "round %s: the held update of job %s (%d examples) sent masked (SecAgg+) for "
            "its buffer's sum", round_label, config[DELIVER_KEY], num_examples,
        )  # fmt: skip
        site_record(msg, outcome="ok", part="held update", examples=num_examples, masked=True)
        return reply
    fate = f"sent {sent}"
    if HELD_METRIC in metrics:
        fate = f"held for a SecAgg+ buffer (job {metrics[HELD_METRIC]})"
    if stage:
        SITE_CONSOLE.info("statistics (%s) of %d examples sent %s", stage, num_examples, sent)
        site_record(msg, outcome="ok", part="statistics", examples=num_examples, masked=masked)
        return reply
    if config.get(PRIVATE_EVALUATION_KEY):
        site_record(msg, outcome="ok", part="private evaluation", examples=num_examples,
                    masked=masked)  # fmt: skip
        SITE_CONSOLE.info(
            "round %s: evaluated the global model on %d examples; its %s sent %s (the "
            "coordinator sees only the sites' sum)", round_label, num_examples,
            config[PRIVATE_EVALUATION_KEY], sent,
        )  # fmt: skip
        return reply
    processes = metrics.get(PROCESSES_METRIC)
    counted = isinstance(processes, (int, float)) and math.isfinite(processes)
    across = f" in {int(processes)} processes" if counted else ""
    SITE_CONSOLE.info(
        "round %s: trained on %d examples%s (%s); update %s", round_label,
        num_examples, across, _metrics_line(metrics) or "no metrics", fate,
    )  # fmt: skip
    site_record(msg, outcome="ok", part="training", examples=num_examples,
                metrics=_numbers(metrics), masked=masked)  # fmt: skip
    return reply


def _sent_bytes(reply: Message) -> str:
    record = reply.content.array_records.get("fitres.parameters")
    size = sum(len(array.data) for array in record.values()) if record is not None else 0
    return f"{size / 1024:.1f} KiB" if size < 1 << 20 else f"{size / (1 << 20):.1f} MiB"


def _round_label(msg: Message, context: Context) -> str:
    """A message's round as the site's console names it: ``3``; for an operator's study
    (several may run at once), ``3 of run 7 (task heart)``, the Flower run and its task."""
    label = _round_number(msg)
    if RUN_OPERATOR_KEY not in context.run_config:
        return label
    task = context.run_config.get(RUN_TASK_KEY, "?")
    return f"{label} of run {msg.metadata.run_id} (task {task})"


def _round_number(msg: Message) -> str:
    """The round the coordinator numbers a message (``ROUND_KEY``: a resumed run counts on
    from its history), else Flower's own count (its ``group_id``), which restarts at 1."""
    for name in ("fitins.config", "evaluateins.config"):
        record = msg.content.config_records.get(name)
        said = record.get(ROUND_KEY) if record is not None else None
        if isinstance(said, int) and not isinstance(said, bool) and said > 0:
            return str(said)
    return msg.metadata.group_id or "-"


def _evaluation_line(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """``round N: evaluated the global model on K examples (loss .., auc ..)``, or why not."""
    round_label = _round_label(msg, context)
    prefix = f"round {round_label}: evaluation {{status}}: "
    reply = _said_if_it_fails(msg, context, call_next, prefix)
    if reply.has_error():
        return reply
    res = compat.recorddict_to_evaluateres(reply.content)
    figures = {"loss": res.loss, **res.metrics}
    shown = ", ".join(
        f"{name} {float(value):.4g}" for name, value in figures.items()
        if name != "seconds" and isinstance(value, (int, float)) and not isinstance(value, bool)
    )  # fmt: skip
    SITE_CONSOLE.info(
        "round %s: evaluated the global model on %d examples (%s)", round_label,
        res.num_examples, shown or "no metrics",
    )  # fmt: skip
    site_record(msg, outcome="ok", part="evaluation", examples=res.num_examples,
                metrics=_numbers(figures))  # fmt: skip
    return reply


def update_check_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Validate the site's own update before it leaves (and before SecAgg+ masks it)."""
    reply = call_next(msg, context)
    if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
        return reply
    if not reply.content.array_records:
        return reply  # a SecAgg+ key-exchange stage: nothing trained yet
    fit_ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = fit_ins.config
    if config.get(PRIVATE_EVALUATION_KEY):
        return reply  # metrics, not an update: the site checked their range itself
    fit_res = compat.recorddict_to_fitres(reply.content, keep_input=True)
    reference = parameter_views(fit_ins.parameters)  # read, never written: no copies
    update = parameter_views(fit_res.parameters)
    max_norm = config.get(MAX_NORM_KEY)
    problem = update_problem(update, reference, float(max_norm) if max_norm else None)
    if problem is not None:
        log.warning("update rejected before sending: %s", problem)
        raise UpdateRejected(problem)
    if SECAGG_CLIP_KEY in config:
        clip = float(config[SECAGG_CLIP_KEY])
        scale = fit_res.num_examples / float(config[SECAGG_MAX_WEIGHT_KEY])
        fraction = clipped_fraction(update, scale, clip)
        if fraction > 0:
            log.warning(
                "%.4f%% of this site's weights exceed the SecAgg+ clipping range ±%g "
                "(at weight %.3g); they will be clipped",
                100 * fraction,
                clip,
                scale,
            )
            metrics = reply.content.config_records.get("fitres.metrics")
            if metrics is not None:
                metrics[CLIPPED_FRACTION_METRIC] = fraction
    return reply


def _fit_config(msg: Message) -> dict | None:
    record = msg.content.config_records.get("fitins.config")
    return dict(record) if record is not None else None


def secagg_when_asked(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``secaggplus_mod`` for rounds the coordinator runs under SecAgg+, its masked
    vector sent in an array record where the coordinator reads it there
    (``SECAGG_VECTOR_ARRAYS_KEY``, ``flower_patches/secagg_vectors.py``: a fraction of the
    seconds Flower's config record costs); plain rounds pass through, so one ClientApp serves
    coordinators with and without it."""
    from flwr.client.mod import secaggplus_mod

    from fedweave.flower_patches import use_fedweave_secagg
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS
    from fedweave.flower_patches.secagg_vectors import vector_as_arrays

    use_fedweave_secagg()

    if (
        msg.metadata.message_type == MessageType.TRAIN
        and RECORD_KEY_CONFIGS in msg.content.config_records
    ):
        reply = secaggplus_mod(msg, context, call_next)
        fit_config = msg.content.config_records.get("fitins.config")
        if fit_config is not None and fit_config.get(SECAGG_VECTOR_ARRAYS_KEY):
            reply = vector_as_arrays(reply)
        return reply
    return call_next(msg, context)


def central_dp_clipping_when_asked(
    msg: Message, context: Context, call_next: ClientAppCallable
) -> Message:
    """Flower's ``fixedclipping_mod`` when the coordinator's central DP asks sites to clip
    (the SecAgg+ case: the server cannot clip updates it never sees)."""
    from flwr.client.mod import fixedclipping_mod

    from fedweave.flower_patches.message_records import KEY_CLIPPING_NORM

    config = _fit_config(msg) if msg.metadata.message_type == MessageType.TRAIN else None
    if config is not None and KEY_CLIPPING_NORM in config:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def site_mods(site_name_of: SiteNameOf = node_site_name) -> list[Mod]:
    """Every site mod, outermost first: every outcome becomes a reply with its code and the
    site's name (``site_name_of``); a deployed run from a coordinator on another release line
    is refused before anything else; tensors the coordinator moves beside its messages
    (``--bulk-address``) are fetched before anything else and the reply's uploaded after
    everything; a model sent at half precision (``--downlink fp16``) is
    restored to its dtypes before any other mod sees it; late rounds, a wrong clock, a run
    the site's policy does not take and a round below the site's privacy floor are refused
    before anything else; SecAgg+ masks
    what the update check has passed, after DP has clipped or noised it; ``--compress``
    compresses the same (never under SecAgg+: the coordinator refuses both)."""

    return [
        answering_outcomes(site_name_of),
        version_guard,
        bulk_transfers,
        downlink_restored,
        stale_round_guard,
        clock_guard,
        site_policy_guard,
        privacy_floor,
        secagg_when_asked,
        site_console_mod,
        holding_updates_when_asked,
        compression_when_asked,
        update_check_mod,
        central_dp_clipping_when_asked,
        local_dp_when_asked,
    ]
