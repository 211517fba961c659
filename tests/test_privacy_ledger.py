"""The privacy ledger (issue 33): what a DP run's rounds spent together, checked against
Google's dp-accounting composing the same releases itself."""

from __future__ import annotations

import math
from types import SimpleNamespace

import dp_accounting
import pytest

from fedweave.config.resume import stored_run_config
from fedweave.config.run_config import RunConfig
from fedweave.contract import SAMPLE_DP_EPSILON_METRIC
from fedweave.coordinator.rounds.privacy_ledger import PrivacyLedger
from fedweave.errors import UserError
from fedweave.history.metrics import final_privacy, recorded_privacy
from fedweave.privacy_accounting import local_noise_multiplier


class _Told:
    def __init__(self) -> None:
        self.privacy: list[dict | None] = []

    def on_round(self, summary) -> None:
        self.privacy.append(summary.privacy)


def _round(replied: int, failed: str | None = None, sampled: int = 4):
    sites = [SimpleNamespace(status="ok" if i < replied else "late") for i in range(sampled)]
    return SimpleNamespace(replied=replied, failed=failed, sites=sites, privacy=None)


def _epsilon(multipliers: list[float], delta: float = 1e-5) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    for multiplier in multipliers:
        accountant.compose(dp_accounting.GaussianDpEvent(multiplier))
    return accountant.get_epsilon(delta)


def _central(**settings) -> RunConfig:
    return RunConfig.of(**{"dp": "central", "noise_multiplier": 1.1, **settings})


def test_central_dp_composes_every_released_round_at_the_full_multiplier():
    """Four sites planned: with a fixed denominator (the sum over 4, whoever replied) a round
    all four made and one only three made are the same mechanism, a release of multiplier
    1.1 for sensitivity C/4; a failed round released nothing and spends nothing, but still
    says what the run has spent."""
    told = _Told()
    ledger = PrivacyLedger([told], _central().privacy, cohort=4)
    for summary in (_round(4), _round(3), _round(1, failed="fewer than --min-replies"),
                    _round(4)):  # fmt: skip
        ledger.on_round(summary)
    assert [p["round_noise_multiplier"] for p in told.privacy] == [1.1, 1.1, None, 1.1]
    assert [p["releases"] for p in told.privacy] == [1, 2, 2, 3]
    assert told.privacy[2]["epsilon"] == told.privacy[1]["epsilon"]
    assert math.isclose(told.privacy[-1]["epsilon"], _epsilon([1.1] * 3), rel_tol=1e-9)
    assert all(p["delta"] == 1e-5 for p in told.privacy)


def test_a_resumed_ledger_continues_from_the_recorded_round_never_from_zero():
    told = _Told()
    whole = PrivacyLedger([told], _central().privacy, cohort=4)
    for replied in (4, 3, 4, 4):
        whole.on_round(_round(replied))
    first = _Told()
    before_crash = PrivacyLedger([first], _central().privacy, cohort=4)
    for replied in (4, 3):
        before_crash.on_round(_round(replied))
    rows = [{"round": 2, "extra": {"privacy": first.privacy[-1]}}]
    after = _Told()
    resumed = PrivacyLedger([after], _central().privacy, 4, recorded_privacy(rows, "central"))
    for replied in (4, 4):
        resumed.on_round(_round(replied))
    assert [p["epsilon"] for p in after.privacy] == [p["epsilon"] for p in told.privacy[2:]]


def test_a_dp_run_whose_recorded_ledger_is_missing_or_damaged_is_refused_in_one_line():
    with pytest.raises(UserError, match="recorded no privacy ledger"):
        recorded_privacy([{"round": 3, "extra": {}}], "central")
    damaged = {"epsilon": 1.0, "delta": 1e-5, "composed": [[0.0, 2]]}
    with pytest.raises(UserError, match="a release without noise"):
        PrivacyLedger([], _central().privacy, 4, damaged)
    with pytest.raises(UserError, match="unreadable"):
        PrivacyLedger([], _central().privacy, 4, {"composed": "x"})
    assert recorded_privacy([{"round": 3, "extra": {}}], "none") is None


def test_local_dp_composes_the_noise_localdpmod_adds_and_says_what_one_round_really_spends():
    """LocalDpMod sizes its noise with the classic Gaussian-mechanism formula for
    --dp-epsilon; that formula holds only below 1, and at the default 10 one round spends
    more than 10 by the RDP account: the ledger says so instead of repeating the 10."""
    config = RunConfig.of(dp="local")
    multiplier = local_noise_multiplier(10.0, 1e-5)
    assert math.isclose(multiplier, math.sqrt(2 * math.log(1.25 / 1e-5)) / 10)
    told = _Told()
    ledger = PrivacyLedger([told], config.privacy, cohort=3)
    ledger.on_round(_round(3, sampled=3))
    ledger.on_round(_round(0, sampled=0))  # no site sampled: nothing sent, nothing spent
    assert told.privacy[0]["epsilon"] == told.privacy[1]["epsilon"] > 10
    assert math.isclose(told.privacy[0]["epsilon"], _epsilon([multiplier]), rel_tol=1e-9)


def test_sample_dp_takes_the_most_any_site_spent_and_ignores_what_is_not_an_epsilon():
    """An insider rewriting its ``dp_epsilon`` (NaN, negative, a string, a bool, left out) neither
    fails the round nor lowers the run's figure: its earlier word stands, the round warns."""
    told = _Told()
    ledger = PrivacyLedger([told], RunConfig.of(dp="sample").privacy, cohort=2)

    def said(honest, insider):
        sites = [
            SimpleNamespace(
                site_id="honest", status="ok", metrics={SAMPLE_DP_EPSILON_METRIC: honest}
            ),
            SimpleNamespace(
                site_id="insider", status="ok",
                metrics={} if insider is None else {SAMPLE_DP_EPSILON_METRIC: insider},
            ),
        ]
        return SimpleNamespace(sites=sites, warnings=[], privacy=None)

    ledger.on_round(first := said(1.5, 2.0))
    assert told.privacy[-1]["epsilon"] == 2.0 and first.warnings == []
    for bad in (float("nan"), float("inf"), -1.0, "0", True, None):
        ledger.on_round(summary := said(2.5, bad))
        assert told.privacy[-1]["sites"] == {"honest": 2.5, "insider": 2.0}
        assert told.privacy[-1]["epsilon"] == 2.5
        assert len(summary.warnings) == 1 and "site insider " in summary.warnings[0]
        assert ("without the epsilon" if bad is None else "reported epsilon") in summary.warnings[0]
    resumed = PrivacyLedger([], RunConfig.of(dp="sample").privacy, 2, told.privacy[-1])
    assert resumed.site_epsilon == {"honest": 2.5, "insider": 2.0}


def test_a_run_without_dp_carries_no_ledger_and_stores_no_dp_settings():
    told = _Told()
    PrivacyLedger([told], RunConfig.of().privacy, cohort=3).on_round(_round(3))
    assert told.privacy == [None]
    assert final_privacy([{"round": 1, "extra": {}}], "none") is None
    assert stored_run_config(RunConfig.of(), "simulate")["settings"]["privacy"] == {"dp": "none"}
    central = stored_run_config(_central(), "simulate")["settings"]["privacy"]
    assert central == {"dp": "central", "noise_multiplier": 1.1, "clipping_norm": 1.0,
                       "dp_delta": 1e-5}  # fmt: skip
    local = stored_run_config(RunConfig.of(dp="local"), "simulate")["settings"]["privacy"]
    assert set(local) == {"dp", "clipping_norm", "dp_epsilon", "dp_delta"}


def test_the_budget_stops_before_a_round_that_would_cross_it_and_holds_back_a_release():
    """--max-epsilon: a round with every site is not started when it would take the ledger
    past the budget; a central-DP release that would cross it is not made, and no round
    starts after that. With a fixed denominator a short mean spends what a full one does."""
    settings = _central(max_epsilon=_epsilon([1.1, 1.1]) + 0.01).privacy
    ledger = PrivacyLedger([], settings, cohort=4)
    assert ledger.next_round_problem(1) is None
    ledger.on_round(_round(4))
    assert ledger.next_round_problem(2) is None
    assert ledger.release_problem(2, in_mean=2) is None  # a short mean: the same release
    ledger.on_round(_round(2))
    held = ledger.release_problem(3, in_mean=4)
    assert held.startswith("privacy budget: round 3's aggregate was not released: a mean of 4")
    assert ledger.next_round_problem(4) == held  # once held back, the run ends
    fresh = PrivacyLedger([], settings, cohort=4)
    fresh.on_round(_round(4))
    fresh.on_round(_round(4))
    stop = fresh.next_round_problem(3)
    assert stop.startswith("privacy budget: stopped before round 3, which would take epsilon")
    assert fresh.epsilon <= settings.max_epsilon


def test_target_epsilon_sizes_the_noise_that_spends_at_most_it_over_the_planned_rounds():
    from fedweave.privacy_accounting import planned, with_planned_noise

    for target, rounds in ((1.0, 20), (3.0, 20), (8.0, 5)):
        config = with_planned_noise(
            _central(target_epsilon=target, rounds=rounds, noise_multiplier=99.0)
        )
        multiplier = config.privacy.noise_multiplier
        assert _epsilon([multiplier] * rounds) <= target
        assert _epsilon([multiplier * 0.99] * rounds) > target  # and not much more noise
    local = RunConfig.of(dp="local", target_epsilon=3.0, rounds=10)
    epsilon = planned(local.privacy, 10)["dp_epsilon"]
    assert _epsilon([local_noise_multiplier(epsilon, 1e-5)] * 10) <= 3.0


def test_history_show_says_what_a_run_spent_or_that_it_had_no_dp():
    from fedweave.history.cli import _privacy_line

    def run(dp: str):
        return SimpleNamespace(config={"settings": {"privacy": {"dp": dp}}})

    assert _privacy_line(run("none"), [{"round": 1, "extra": {}}]) == "no differential privacy"
    row = {"round": 4, "extra": {"privacy": {"epsilon": 2.5, "delta": 1e-6}}}
    assert _privacy_line(run("central"), [row]).startswith(
        "differential privacy central: epsilon 2.500 at delta 1e-06 after round 4"
    )


@pytest.mark.parametrize(
    "floor, config, secure, refused",
    [
        ({"require-secure-agg": "true"}, {"fw-dp": "none"}, False, "--require-secure-agg"),
        ({"require-secure-agg": "true"}, {"fw-dp": "none"}, True, None),
        ({"require-secure-agg": "true"}, {"fw-hold": True}, False, None),  # held for SecAgg+
        ({"require-secure-agg": "true"}, {"fw-statistics-stage": "moments"}, False,
         "--require-secure-agg"),
        ({"require-dp": "any"}, {"fw-dp": "none"}, True, "--require-dp any"),
        ({"require-dp": "any"}, {"fw-dp": "central"}, True, None),
        ({"require-dp": "local"}, {"fw-dp": "central"}, True, "--require-dp local"),
        ({"require-dp": "local"}, {"fw-dp": "sample"}, True, None),
        ({"require-dp": "sample"}, {"fw-dp": "local"}, True, "--dp sample, or restart"),
        ({"max-epsilon": "5.0"}, {"fw-dp": "sample"}, True, None),  # its own ledger decides
        ({"require-dp": "local"}, {}, True, "the run has --dp none"),  # says nothing: no DP
        ({"require-dp": "any"}, {"fw-statistics-stage": "moments"}, True,
         "asks for statistics of its data"),  # not a DP release: a DP run never asks
        ({"max-epsilon": "5.0"}, {"fw-statistics-stage": "scale"}, True, "--max-epsilon 5"),
        ({"require-secure-agg": "true"}, {"fw-statistics-stage": "scale"}, True, None),
        ({"require-dp": "any"}, {"fw-private-evaluation": "1"}, True, None),
        ({"max-epsilon": "5.0"}, {"fw-dp": "none"}, True, "has no differential privacy"),
        ({"max-epsilon": "5.0"}, {"fw-dp": "central", "fw-dp-epsilon-after": 4.9}, True, None),
        ({"max-epsilon": "5.0"}, {"fw-dp": "local", "fw-dp-epsilon-after": 5.1,
                                  "fw-dp-delta": 1e-5}, True, "the run's ledger to 5.100"),
        ({"max-epsilon": "5.0"}, {"fw-dp": "central"}, True, "would take the run's ledger to inf"),
        ({}, {"fw-dp": "none"}, False, None),
    ],
)  # fmt: skip
def test_a_sites_privacy_floor_refuses_a_round_below_it_with_the_setting_named(
    floor, config, secure, refused
):
    from fedweave.client.mods import floor_problem

    problem = floor_problem(floor, config, secure)
    if refused is None:
        assert problem is None
    else:
        assert refused in problem and "restart this site without that floor" in problem
