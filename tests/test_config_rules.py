"""Each check beside its option: a bound on the option's declaration (``sections.py``), a rule
across options declared once (``fedweave/config/rules.py``), and every command that takes the
options runs the same check when it resolves them (``check_settings``). In-process: no
command is started."""

from __future__ import annotations

import itertools

import pytest
import typer
import typer.testing

from fedweave.config import COMMAND_SETTINGS, SETTINGS, RunConfig
from fedweave.config.commands import check_settings, config_command
from fedweave.config.rules import ROUND_SITES, RULES, Options, rules_for
from fedweave.errors import UserError

RESOLVED = ("simulate", "coordinator", "evaluate", "client", "peer")


def _resolve(command: str, *args: str) -> RunConfig:
    """``command``'s options resolved from ``args`` as its Typer command resolves them (flags,
    then ``check_settings``); a refusal is raised as its ``UserError``."""
    seen: list[RunConfig] = []
    app = typer.Typer()
    app.command(command)(config_command(command, lambda config, _: seen.append(config), "t"))
    app.command("other")(lambda: None)
    result = typer.testing.CliRunner().invoke(app, [command, *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return seen[0]


def _the_rule(*settings: str):
    (rule,) = [rule for rule in RULES if set(rule.settings) == set(settings)]
    return rule


@pytest.mark.parametrize(
    "args, said",
    [
        (("--strategy", "krum"), "--strategy krum compares individual site updates"),
        (("--schedule", "async", "--strategy", "fedadam", "--no-secure-agg"),
         "--strategy fedadam works on a round's whole cohort"),
        (("--buffer", "2"), "--buffer is for --schedule async"),
        (("--compress", "int8"), "under SecAgg+ sites send masked integers"),
        (("--compress", "topk:2"), "the top-k fraction must be in (0, 1]"),
        (("--dp", "central", "--clipping-norm", "0"), "--clipping-norm must be > 0"),
        (("--dp", "central", "--noise-multiplier", "0"), "its epsilon is infinite"),
        (("--dp", "central", "--dp-delta", "0.5"), "--dp-delta 0.5 is at least 1 / the 3 sites"),
        (("--dp", "local", "--dp-delta", "1"), "--dp-delta 1 must be between 0 and 1"),
        (("--dp", "local", "--dp-epsilon", "0"), "--dp-epsilon must be > 0 for --dp local"),
        (("--dp", "central", "--strategy", "krum", "--no-secure-agg"),
         "--strategy krum is not a mean of the clipped updates"),
        (("--dp", "local", "--schedule", "async"), "--dp local with --schedule async"),
        (("--max-epsilon", "5"), "--max-epsilon is a privacy budget, but the run has no"),
        (("--dp", "sample", "--strategy", "fedprox"), "DP-SGD's per-example clipping does not"),
        (("--dp", "sample", "--max-epsilon", "5"), "each site accounts its own examples"),
        (("--dp", "sample", "--noise-multiplier", "0"), "--dp sample would protect nothing"),
        (("--dp", "sample", "--schedule", "async"), "--dp sample with --schedule async"),
        (("--dp", "central", "--max-epsilon", "1"),
         "--max-epsilon 1 is below what one round spends (4.729 at delta 1e-05)"),
        (("--private-evaluation", "--cross-site"), "--cross-site records each site's figures"),
        (("--min-replies", "4"), "--min-replies 4 is more than the 3 sites sampled per round"),
        (("--rounds", "0"), "--rounds must be at least 1, got 0"),
    ],
)  # fmt: skip
def test_simulate_and_the_coordinator_refuse_a_combination_with_the_one_declared_rule(args, said):
    sites = ("--clients", "3")  # a simulation's sites; the coordinator's are --min-clients 3
    for command, extra in (("simulate", sites), ("coordinator", ("--insecure",))):
        with pytest.raises(UserError) as refused:
            _resolve(command, *extra, *args)
        assert said in str(refused.value), (command, str(refused.value))
        assert "\n" not in str(refused.value)


def test_one_rule_object_is_what_both_commands_run():
    rule = _the_rule("strategy", "secure_agg")
    config = RunConfig.of(strategy="krum")
    assert rule in rules_for(config, "simulate") and rule in rules_for(config, "coordinator")
    assert rule not in rules_for(config, "peer")  # the peer takes neither option
    for command in ("simulate", "coordinator"):
        assert "compares individual" in rule.check(Options(config, command, rule))
    # each command counts its own sites: a simulation all --clients, a deployment --min-clients
    rule = _the_rule("private_evaluation", "fraction_evaluate")
    private = RunConfig.of(private_evaluation=True, fraction_evaluate=0.5, clients=4,
                           min_clients=4)  # fmt: skip
    assert "asks 2 of 4 sites" in rule.check(Options(private, "simulate", rule))
    assert "(or --clients)" in rule.check(Options(private, "simulate", rule))
    assert "(or --min-clients)" in rule.check(Options(private, "coordinator", rule))


def test_every_rule_names_only_declared_settings_and_reads_only_those():
    assert len({rule.says for rule in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.settings and set(rule.settings) <= set(SETTINGS), rule.says
        assert len(set(rule.settings)) == len(rule.settings), rule.says
        takers = [c for c in COMMAND_SETTINGS if set(rule.settings) <= set(COMMAND_SETTINGS[c])]
        assert takers, f"no command takes every setting of {rule.says!r}"
        if rule.federated:
            assert set(takers) & set(ROUND_SITES), rule.says
        assert rule.runs in (None, "federated", "gossip"), rule.says
    for command, sites in ROUND_SITES.items():
        assert sites in SETTINGS and sites in COMMAND_SETTINGS[command]
    # every check runs on configs that switch its settings on and off, for every command that
    # takes them: a setting it reads but does not name raises KeyError (``Options``)
    variants = [
        {},
        {"secure_agg": False, "schedule": "async", "dp": "central", "compress": "fp16"},
        {"private_evaluation": True, "fraction_evaluate": 0.1, "evaluate_every": 0,
         "cross_site": True, "min_replies": 9, "clients_per_round": 5, "buffer": 2},
        {"site_speeds": "lognormal:1", "stragglers": 0.5, "simulated_deadline": 3.0,
         "max_staleness": 1, "server_lr": 0.5, "strategy": "krum"},
        {"mode": "gossip", "stragglers": 0.3, "resume": "latest", "ray_address": "auto",
         "insecure": True},
    ]  # fmt: skip
    for values, command in itertools.product(variants, RESOLVED):
        config = RunConfig.of(**values)
        for rule in rules_for(config, command):
            problem = rule.check(Options(config, command, rule))
            assert problem is None or (isinstance(problem, str) and "\n" not in problem)


def test_a_bound_can_differ_by_command_and_is_declared_on_the_option():
    assert dict(SETTINGS["rounds"].meta.minimum_in) == {"simulate": 1, "coordinator": 1}
    endless = RunConfig.of(rounds=0, listen="tcp://127.0.0.1:5555", insecure=True)
    check_settings(endless, "peer")  # a peer given 0 runs until stopped
    for command in ("simulate", "coordinator"):
        with pytest.raises(UserError, match="--rounds must be at least 1, got 0"):
            check_settings(endless, command)


def test_a_gossip_simulation_skips_the_rules_of_federated_rounds():
    gossip = RunConfig.of(mode="gossip", compress="fp16", strategy="krum")
    check_settings(gossip, "simulate")  # SecAgg+ is on by default, but gossip has none
    with pytest.raises(UserError, match="under SecAgg"):
        check_settings(gossip.replace(mode="federated", strategy="fedavg"), "simulate")
    with pytest.raises(UserError, match="--stragglers is for federated simulations"):
        check_settings(gossip.replace(stragglers=0.2), "simulate")


def test_transport_security_rules_are_shared_by_the_commands_that_take_the_options():
    for command in ("coordinator", "evaluate"):
        config = RunConfig.of(run="latest")
        with pytest.raises(UserError, match="pass --tls-dir DIR .* or --insecure"):
            check_settings(config, command)
        with pytest.raises(UserError, match="--insecure and --tls-dir contradict"):
            check_settings(config.replace(insecure=True, tls_dir="tls"), command)
    site = RunConfig.of(coordinator="host:9092")
    with pytest.raises(UserError, match="pass --ca-cert ca.pem"):
        check_settings(site, "client")
    with pytest.raises(UserError, match="--insecure and --ca-cert contradict"):
        check_settings(site.replace(insecure=True, ca_cert="ca.pem"), "client")
    peer = RunConfig.of(listen="tcp://127.0.0.1:5555", insecure=True, keys="keys")
    with pytest.raises(UserError, match="--insecure turns CURVE off"):
        check_settings(peer, "peer")


def test_gossip_rules_bind_the_peer_and_a_gossip_simulation_alike():
    top_k = RunConfig.of(listen="tcp://127.0.0.1:5555", insecure=True, compress="topk:0.1")
    for command, config in (("peer", top_k), ("simulate", top_k.replace(mode="gossip"))):
        with pytest.raises(UserError, match="gossip peers send whole models"):
            check_settings(config, command)
    # a federated simulation sends updates, where top-k is one of the compressions
    check_settings(top_k.replace(secure_agg=False), "simulate")


def test_the_strategies_the_rules_call_robust_are_declared_choices():
    from fedweave.config.sections import ROBUST_STRATEGIES, STRATEGIES

    assert ROBUST_STRATEGIES < set(STRATEGIES) == set(SETTINGS["strategy"].meta.choices)
