"""What protects a federated run and how its rounds close, said once at its start.

Every federated run command (``fedweave coordinator``, ``fedweave simulate --mode
federated``) prints ``header_line`` before its first round, keeps ``protections`` in the
history with the run's config, and the simulation's report carries the same dictionary, so an
operator never has to guess whether SecAgg+, TLS or site authentication were on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedweave.config import RunConfig
from fedweave.coordinator.rounds.deadlines import MEASURED_FACTOR
from fedweave.coordinator.rounds.privacy_ledger import ledger_facts
from fedweave.privacy.statement import SITES_REPORT_UNDER_DP

if TYPE_CHECKING:
    from fedweave.coordinator.rounds.deadlines import RoundDeadline


def protections(
    config: RunConfig,
    cohort: int,
    deadline: RoundDeadline,
    *,
    tls: bool | None = None,
    site_authentication: bool | None = None,
    central_data: bool = True,
) -> dict[str, Any]:
    """The run's protections and round rules as plain values.

    Args:
        config: the run's settings.
        cohort: sites sampled per round.
        deadline: the deadline rounds close at (fixed, or measured from the sites' times).
        tls / site_authentication: for a deployment; ``None`` in a simulation, where sites
            are processes of this machine and nothing crosses a network.
        central_data: whether the coordinator holds test data (central evaluation, and the
            default deadline sized on it).
    """
    from fedweave.config.cohorts import derive_shares
    from fedweave.learning.personal import task_local_layers

    secure = config.secure_aggregation.secure_agg
    secagg: dict[str, Any] = {"on": secure}
    if secure:
        schedule = _schedule(config, cohort).get("schedule")
        # an asynchronous run's SecAgg+ cohort is each buffer
        shares, threshold = derive_shares(schedule["buffer"] if schedule else cohort)
        secagg.update(shares=shares, threshold=threshold)
    privacy = config.privacy
    dp: dict[str, Any] = {"mode": privacy.dp}
    if privacy.dp == "central":
        dp.update(
            noise_multiplier=privacy.noise_multiplier, clipping_norm=privacy.clipping_norm,
            delta=privacy.dp_delta,
        )  # fmt: skip
    elif privacy.dp == "sample":  # DP-SGD at every site; clipping is per example
        dp.update(
            noise_multiplier=privacy.noise_multiplier, clipping_norm=privacy.clipping_norm,
            delta=privacy.dp_delta,
        )  # fmt: skip
    elif privacy.dp == "local":
        dp.update(  # what LocalDpMod is given each round; the ledger composes the rounds
            clipping_norm=privacy.clipping_norm,
            epsilon_per_round=privacy.dp_epsilon,
            delta_per_round=privacy.dp_delta,
        )
    if privacy.dp != "none":
        budget = {"target_epsilon": privacy.target_epsilon, "max_epsilon": privacy.max_epsilon}
        dp.update({name: value for name, value in budget.items() if value is not None})
        dp["ledger"] = ledger_facts(privacy)
        from fedweave.learning.statistics import needs_statistics
        from fedweave.learning.tasks import load_task

        if needs_statistics(load_task(config.data.task)):
            dp["ledger"]["statistics"] = (
                "none gathered from the sites, the features scaled by the task's declared bounds"
            )
        dp["ledger"]["sites_report"] = SITES_REPORT_UNDER_DP
        not_covered = []
        if config.evaluation.evaluate_every:
            not_covered.append("the sites' evaluation metrics")
            if config.evaluation.select_metric:
                not_covered.append(
                    f"best-round selection on them (--select-metric "
                    f"{config.evaluation.select_metric})"
                )
        if not_covered:
            dp["ledger"]["not_covered"] = " and ".join(not_covered)
    federation = config.federation
    return {
        "secure_aggregation": secagg,
        "tls": tls,
        "site_authentication": site_authentication,
        "differential_privacy": dp,
        "strategy": federation.strategy,
        "round_timeout": round(deadline.seconds, 1),
        "round_timeout_given": federation.round_timeout is not None,
        "round_timeout_measured": deadline.measured,
        "min_replies": federation.min_replies or 1,
        "sites_per_round": cohort,
        "stragglers": config.simulation.stragglers,
        "evaluation": {
            "central": central_data,
            "federated_every": config.evaluation.evaluate_every,
            "fraction_evaluate": config.evaluation.fraction_evaluate,
            "private": config.evaluation.private_evaluation,
            "local_layers": list(task_local_layers(config.data.task)),
        },
        **_schedule(config, cohort),
    }


def _schedule(config: RunConfig, cohort: int) -> dict[str, Any]:
    """An asynchronous schedule, compressed updates, a half-precision downlink and a simulated
    clock, when the run has them."""
    federation, simulation = config.federation, config.simulation
    found: dict[str, Any] = {}
    if federation.schedule == "async":
        from fedweave.coordinator.rounds.round_settings import ServerSettings

        found["schedule"] = {
            "kind": "async",
            "buffer": ServerSettings(config, cohort, config.training.rounds).buffer,
            "max_staleness": federation.max_staleness,
        }
    if federation.compress != "none":
        found["compress"] = federation.compress
    if federation.downlink != "full":
        found["downlink"] = federation.downlink
    if simulation.site_speeds is not None:
        found["simulated_clock"] = {
            "site_speeds": simulation.site_speeds,
            "deadline": simulation.simulated_deadline,
        }
    return found


def _on_off(value: bool | None, on: str, off: str) -> str:
    return "n/a (simulation)" if value is None else (on if value else off)


def header_line(facts: dict[str, Any]) -> str:
    """``protections`` on one line, as the run commands print it."""
    secagg = facts["secure_aggregation"]
    secure = (
        f"on ({secagg['shares']} shares, threshold {secagg['threshold']})"
        if secagg["on"]
        else "OFF (the coordinator sees each site's update)"
    )
    dp = facts["differential_privacy"]
    dp_text = dp["mode"] + "".join(
        f" {k.replace('_', ' ')} {v:g}" for k, v in dp.items() if k not in ("mode", "ledger")
    )
    ledger = dp.get("ledger")
    if ledger:
        amplification = ledger["sampling_amplification"]
        dp_text += (
            f" (epsilon composed over the rounds by {ledger['accountant']} at delta "
            f"{ledger['delta']:g}, one {ledger['unit']} as the unit, relation "
            f"{ledger['neighbouring']}, sensitivity {ledger['sensitivity']}, "
            + ("no amplification by sampling claimed" if amplification == "not claimed"
               else f"amplification by {amplification}")
            + f"; noise {ledger['noise']}"
            + (f"; sites report {ledger['sites_report']}" if ledger.get("sites_report") else "")
            + (f"; statistics: {ledger['statistics']}" if ledger.get("statistics") else "")
            + (f"; not covered: {ledger['not_covered']}" if ledger.get("not_covered") else "")
            + ")"
        )  # fmt: skip
    evaluation = facts.get("evaluation") or {"central": True, "federated_every": 0}
    deadline = f"{facts['round_timeout']:g} s" + (
        ""
        if facts["round_timeout_given"]
        else " (sized from the task)"
        if evaluation["central"]
        else f" until the sites' training times are measured, then {MEASURED_FACTOR:g}x the "
        "slowest (no data at the coordinator to size it on)"
        if facts.get("round_timeout_measured")
        else " (default: no data at the coordinator to size it on)"
    )
    every = evaluation["federated_every"]
    scored = [
        *(["central"] if evaluation["central"] and not evaluation.get("local_layers") else []),
        *(
            [
                f"federated every {'' if every == 1 else f'{every} '}round"
                f"{'' if every == 1 else 's'} ({100 * evaluation['fraction_evaluate']:g}% of "
                "sites"
                + ("; private: only their sum through SecAgg+)" if evaluation.get("private")
                   else ")")
            ]
            if every
            else []
        ),
    ]
    stragglers = facts.get("stragglers") or 0
    straggling = (
        f"; simulated stragglers {100 * stragglers:g}% a round "
        f"({'partial work counts' if facts['strategy'] == 'fedprox' else 'dropped as late'})"
        if stragglers
        else ""
    )
    schedule = facts.get("schedule")
    if schedule:
        stale = schedule.get("max_staleness")
        return (
            f"SecAgg+ {secure}; strategy {facts['strategy']}; asynchronous (FedBuff): the model "
            f"moves every {schedule['buffer']} site updates, each weighted by its staleness"
            + (", each buffer summed by its own SecAgg+ round" if secagg["on"] else "")
            + (f", discarded beyond {stale} steps" if stale is not None else "")
            + "; evaluation central, every step" + _compress_text(facts) + _downlink_text(facts)
            + _clock_text(facts)
        )
    return (
        f"SecAgg+ {secure}; TLS {_on_off(facts['tls'], 'on', 'OFF')}; site authentication "
        f"{_on_off(facts['site_authentication'], 'required', 'OFF (any CA holder joins)')}; "
        f"DP {dp_text}; strategy "
        f"{facts['strategy']}; {facts['sites_per_round']} sites a round; round deadline "
        f"{deadline}, min replies {facts['min_replies']}{straggling}; evaluation "
        f"{' + '.join(scored) or 'none'}" + _local_text(evaluation) + _compress_text(facts)
        + _downlink_text(facts) + _clock_text(facts)
    )


def _local_text(evaluation: dict[str, Any]) -> str:
    layers = evaluation.get("local_layers")
    if not layers:
        return ""
    return (f"; layers {', '.join(layers)} stay at each site (never sent; each site scores "
            "with its own, no central evaluation)")  # fmt: skip


def _compress_text(facts: dict[str, Any]) -> str:
    kind = facts.get("compress")
    return f"; updates sent {kind}-compressed, with error feedback" if kind else ""


def _downlink_text(facts: dict[str, Any]) -> str:
    kind = facts.get("downlink")
    return f"; global model sent at {kind} (half the bytes down)" if kind else ""


def _clock_text(facts: dict[str, Any]) -> str:
    clock = facts.get("simulated_clock")
    if not clock:
        return ""
    deadline = clock.get("deadline")
    return (
        f"; simulated clock: sites {clock['site_speeds']}"
        + (f", rounds close {deadline:g} simulated s after they start" if deadline else "")
    )
