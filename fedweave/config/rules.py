"""Every rule that ties options together, declared once: the settings it reads, what it says
in one line, and its check.

A plain bound (a minimum, a choice) sits on the option itself (``sections.py``); what one
option cannot say alone is here. ``check_settings`` (``commands.py``) runs, for each command,
every rule whose settings that command takes, so ``fedweave simulate`` and ``fedweave
coordinator`` refuse a combination with the same line from the same declaration, whichever
process resolves the options. A check reads only the settings its rule names (``Options``
refuses any other), so the names are the whole truth about which commands run it.

Checks that need loaded inputs (test data, site files, keys, certificates) are not here: each
command has its own checks module (``coordinator/command/run_checks.py``,
``client/site_checks.py``, ``simulations/run_checks.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedweave.config.cohorts import (
    MIN_SECAGG_COHORT,
    async_buffer,
    derive_shares,
    round_cohort,
    secagg_cohort_problem,
)
from fedweave.config.fields import flag_name
from fedweave.config.sections import COMMAND_SETTINGS, ROBUST_STRATEGIES
from fedweave.errors import UserError

if TYPE_CHECKING:
    from fedweave.config.run_config import RunConfig

ROUND_SITES: dict[str, str] = {"coordinator": "min_clients", "simulate": "clients"}
"""Commands that run federated rounds → the setting that counts the sites a round draws from
(a deployment waits for ``--min-clients``; a simulation connects all ``--clients``)."""


@dataclass(frozen=True)
class Options:
    """What one rule's check sees: the settings its rule names, and what they compute."""

    config: RunConfig
    command: str
    rule: Rule

    def __getitem__(self, name: str) -> Any:
        if name not in self.rule.settings and name != ROUND_SITES.get(self.command):
            raise KeyError(f"rule {self.rule.says!r} reads {name!r}, which it does not name")
        return self.config.value(name)

    @property
    def sites(self) -> int:
        """The sites a round draws from (``ROUND_SITES``); federated rules only."""
        return self[ROUND_SITES[self.command]]

    @property
    def sites_flag(self) -> str:
        return flag_name(ROUND_SITES[self.command])

    @property
    def cohort(self) -> int:
        return round_cohort(self["clients_per_round"], self.sites)

    @property
    def buffer(self) -> int:
        return async_buffer(self["buffer"], self.sites, self["secure_agg"])


@dataclass(frozen=True)
class Rule:
    """One rule across options.

    Attributes:
        settings: every setting the check reads; a command runs the rule when it takes them
            all.
        says: the rule in one line (for docs and tests; the error names the values).
        check: the refusal's one line, or None when the options keep the rule.
        runs: ``federated`` or ``gossip``: a rule of that kind of run only (``run_kind``); a
            federated rule may read the sites a round draws from (``ROUND_SITES``). None: a
            rule wherever its settings are taken.
    """

    settings: tuple[str, ...]
    says: str
    check: Callable[[Options], str | None]
    runs: str | None = None

    @property
    def federated(self) -> bool:
        return self.runs == "federated"


RULES: list[Rule] = []
"""Every rule, in the order they are checked (the first broken one is reported)."""


def _rule(*settings: str, says: str, federated: bool = False, gossip: bool = False):
    runs = "federated" if federated else "gossip" if gossip else None

    def declare(check: Callable[[Options], str | None]) -> Callable[[Options], str | None]:
        RULES.append(Rule(settings, says, check, runs))
        return check

    return declare


RUN_KINDS: dict[str, str] = {"coordinator": "federated", "peer": "gossip"}
"""Commands that run one kind of run; ``fedweave simulate`` runs its ``--mode``."""


def run_kind(config: RunConfig, command: str) -> str | None:
    """``federated`` or ``gossip``: what ``command`` runs with ``config`` (the rules of that
    kind apply), or None (a command that runs neither: evaluate, client)."""
    if "mode" in COMMAND_SETTINGS[command]:
        return config.simulation.mode
    return RUN_KINDS.get(command)


def rules_for(config: RunConfig, command: str) -> list[Rule]:
    """The rules ``command`` runs on ``config``: those whose settings it takes all of, of the
    kind of run it runs."""
    taken = set(COMMAND_SETTINGS[command])
    kind = run_kind(config, command)
    return [
        rule for rule in RULES
        if taken.issuperset(rule.settings) and rule.runs in (None, kind)
    ]  # fmt: skip


def check_rules(config: RunConfig, command: str) -> None:
    """Refuse the first rule ``config`` breaks for ``command`` (a one-line ``UserError``)."""
    for rule in rules_for(config, command):
        problem = rule.check(Options(config, command, rule))
        if problem is not None:
            raise UserError(problem)


# --- connection ------------------------------------------------------------------------------


@_rule("insecure", "tls_dir", says="a coordinator has TLS (--tls-dir) or --insecure, not both")
def _coordinator_tls(o: Options) -> str | None:
    if o["insecure"] and o["tls_dir"] is not None:
        return "--insecure and --tls-dir contradict each other; give one"
    if not o["insecure"] and o["tls_dir"] is None:
        return (
            "TLS is on by default: pass --tls-dir DIR (make one with "
            "`fedweave certs init --out DIR --host NAME`) or --insecure"
        )
    return None


@_rule("studies_only", "operator_address", "resume",
       says="a coordinator with --studies-only has an operator door and nothing to resume")
def _studies_only(o: Options) -> str | None:
    if o["studies_only"] and o["operator_address"] is None:
        return "--studies-only runs operators' studies only: give --operator-address HOST:PORT"
    if o["studies_only"] and o["resume"] is not None:
        return "--studies-only runs no run of its own to resume: drop --resume or --studies-only"
    return None


@_rule("sites", "min_clients", "schedule", "insecure", "allow_unregistered_sites",
       says="a run naming its sites names them by their keys, waits for no more, in sync rounds")
def _named_sites(o: Options) -> str | None:
    names = site_names(o["sites"])
    if not names:
        return None
    if len(set(names)) != len(names):
        return f"--sites {o['sites']} names a site twice; name each once"
    if o["insecure"] or o["allow_unregistered_sites"]:
        return (
            "--sites names sites by their registered keys, which needs TLS and site keys: drop "
            "--insecure / --allow-unregistered-sites, or --sites"
        )
    if o["min_clients"] > len(names):
        return (
            f"--min-clients {o['min_clients']} waits for more sites than --sites names "
            f"({len(names)}); lower --min-clients to {len(names)} or name more sites"
        )
    if o["schedule"] != "sync":
        return "--sites takes synchronous rounds (--schedule sync); drop one of them"
    return None


def site_names(given: str) -> list[str]:
    """``--sites`` as a list of names (empty: every site)."""
    return [name.strip() for name in given.split(",") if name.strip()]


@_rule("insecure", "ca_cert", says="a site has the coordinator's --ca-cert or --insecure, not both")
def _site_tls(o: Options) -> str | None:
    if o["insecure"] and o["ca_cert"] is not None:
        return "--insecure and --ca-cert contradict each other; give one"
    if not o["insecure"] and o["ca_cert"] is None:
        return (
            "TLS is on by default: pass --ca-cert ca.pem (the coordinator's "
            "`fedweave certs init` wrote it) or --insecure"
        )
    return None


@_rule("insecure", "keys", says="a peer without CURVE (--insecure) takes no --keys")
def _peer_curve(o: Options) -> str | None:
    if o["insecure"] and o["keys"] is not None:
        return "--insecure turns CURVE off: leave out --keys (or --insecure)"
    return None


# --- simulation ------------------------------------------------------------------------------


@_rule("clients_per_round", "clients", says="a simulation samples at most its --clients")
def _sampled_of_simulated(o: Options) -> str | None:
    per_round, clients = o["clients_per_round"], o["clients"]
    if per_round is not None and not 1 <= per_round <= clients:
        return f"--clients-per-round must be between 1 and --clients ({clients})"
    return None


def _federated_only(name: str, line: str):
    @_rule("mode", name, says=f"{flag_name(name)} is for federated simulations")
    def check(o: Options) -> str | None:
        return line if o["mode"] == "gossip" and o[name] else None

    return check


_federated_only(
    "data_dir",
    "--data-dir is for federated simulations for now; give each peer its file with fedweave "
    "peer --data",
)
_federated_only("stragglers", "--stragglers is for federated simulations; leave it out with gossip")
_federated_only(
    "ray_address",
    "--ray-address is for federated simulations (gossip peers run as processes here); leave it "
    "out with gossip",
)
_federated_only("resume", "--resume is for federated runs; a gossip peer rejoins by starting again")


# --- adapters --------------------------------------------------------------------------------


@_rule("peft", "initial_model", says="LoRA adapts a pretrained base: --peft lora needs one")
def _adapter_needs_a_base(o: Options) -> str | None:
    if o["peft"] == "lora" and o["initial_model"] is None:
        return (
            "--peft lora trains adapters on a frozen pretrained base: give the base with "
            "--initial-model FILE.safetensors"
        )
    return None


@_rule("peft", "dp", federated=True, says="--dp sample trains every tensor (not with LoRA yet)")
def _adapter_without_sample_dp(o: Options) -> str | None:
    if o["peft"] == "lora" and o["dp"] == "sample":
        return (
            "--dp sample with --peft lora is not supported yet (Opacus would clip the frozen "
            "base's per-example gradients too); use --dp central or --dp local with adapters"
        )
    return None


# --- federated rounds ------------------------------------------------------------------------


@_rule("strategy", "secure_agg", federated=True,
       says="a robust strategy compares single updates, which SecAgg+ hides")  # fmt: skip
def _robust_strategy_needs_updates(o: Options) -> str | None:
    name = o["strategy"]
    if o["secure_agg"] and name in ROBUST_STRATEGIES:
        return (
            f"--strategy {name} compares individual site updates, but SecAgg+ only reveals "
            "their sum; use --no-secure-agg for robust aggregation, or fedavg/fedprox/fedadam/"
            "fedyogi with SecAgg+"
        )
    return None


@_rule("dp", "clipping_norm", federated=True, says="differential privacy clips to a norm > 0")
def _dp_clips(o: Options) -> str | None:
    if o["dp"] != "none" and not o["clipping_norm"] > 0:
        return "--clipping-norm must be > 0 for differential privacy"
    return None


@_rule("dp", "noise_multiplier", "target_epsilon", federated=True,
       says="central and sample DP add noise (> 0)")  # fmt: skip
def _dp_noises(o: Options) -> str | None:
    sized = o["dp"] == "central" and o["target_epsilon"] is not None
    if o["dp"] in ("central", "sample") and not sized and not o["noise_multiplier"] > 0:
        return (
            f"--noise-multiplier {o['noise_multiplier']:g} adds no noise, so --dp {o['dp']} "
            "would protect nothing (its epsilon is infinite); give a noise multiplier > 0, "
            "or --dp none"
        )
    return None


@_rule("dp", "strategy", "target_epsilon", "max_epsilon", federated=True,
       says="sample DP: plain local steps, budgets at the sites")  # fmt: skip
def _sample_dp(o: Options) -> str | None:
    if o["dp"] != "sample":
        return None
    if o["strategy"] == "fedprox":
        return (
            "--strategy fedprox adds a proximal term to each site's loss, which DP-SGD's "
            "per-example clipping does not see (its gradient would go unclipped and "
            "unaccounted); use fedavg, fedadam or fedyogi with --dp sample"
        )
    given = [f for f in ("target_epsilon", "max_epsilon") if o[f] is not None]
    if given:
        return (
            f"{flag_name(given[0])} with --dp sample: each site accounts its own examples "
            "(its epsilon depends on its size), so the budget is each site's: fedweave "
            "client --max-epsilon E; drop it here"
        )
    return None


@_rule("dp", "dp_epsilon", federated=True, says="local DP sizes its noise for an epsilon > 0")
def _local_dp_epsilon(o: Options) -> str | None:
    if o["dp"] == "local" and not o["dp_epsilon"] > 0:
        return "--dp-epsilon must be > 0 for --dp local (its noise is sized for it)"
    return None


@_rule("dp", "dp_delta", federated=True,
       says="a DP delta is between 0 and 1, and under central DP below 1 / the sites")  # fmt: skip
def _dp_delta(o: Options) -> str | None:
    delta = o["dp_delta"]
    if o["dp"] == "none":
        return None
    if not 0 < delta < 1:
        return f"--dp-delta {delta:g} must be between 0 and 1 (say 1e-5)"
    if o["dp"] == "central" and delta >= 1 / o.sites:
        return (
            f"--dp-delta {delta:g} is at least 1 / the {o.sites} sites: a guarantee that may "
            f"fail for one site in {o.sites} protects none; give --dp-delta below {1 / o.sites:g}"
        )
    return None


@_rule("dp", "target_epsilon", "max_epsilon", federated=True,
       says="a privacy budget is for a DP run")  # fmt: skip
def _budget_needs_dp(o: Options) -> str | None:
    given = [f for f in ("target_epsilon", "max_epsilon") if o[f] is not None]
    if o["dp"] == "none" and given:
        return (
            f"{flag_name(given[0])} is a privacy budget, but the run has no differential "
            "privacy; add --dp central or --dp local"
        )
    return None


@_rule("dp", "max_epsilon", "target_epsilon", "noise_multiplier", "dp_epsilon", "dp_delta",
       "rounds", federated=True, says="--max-epsilon allows at least one round")  # fmt: skip
def _budget_allows_a_round(o: Options) -> str | None:
    budget = o["max_epsilon"]
    if o["dp"] not in ("central", "local") or budget is None or not 0 < o["dp_delta"] < 1:
        return None
    from fedweave.privacy_accounting import planned, round_multiplier, spent

    privacy = o.config.privacy
    if o["target_epsilon"] is not None:
        privacy = o.config.replace(**planned(privacy, o["rounds"])).privacy
    if not round_multiplier(privacy) > 0:
        return None  # the noise's own rule says why
    one_round = spent([(round_multiplier(privacy), 1)], o["dp_delta"])
    if one_round > budget:
        return (
            f"--max-epsilon {budget:g} is below what one round spends ({one_round:.3f} at "
            f"delta {o['dp_delta']:g}), so no round could run; raise it, or add noise"
        )
    return None


@_rule("dp", "strategy", federated=True, says="central DP's accountant assumes a mean")
def _central_dp_mean(o: Options) -> str | None:
    if o["dp"] == "central" and o["strategy"] in ROBUST_STRATEGIES:
        return (
            f"--strategy {o['strategy']} is not a mean of the clipped updates, which is what "
            "--dp central's noise and its privacy ledger are sized for; use fedavg or fedprox "
            "with --dp central"
        )
    if o["dp"] == "central" and o["strategy"] in ("fedadam", "fedyogi"):
        return (
            f"--strategy {o['strategy']} keeps optimizer state from each round's mean before "
            "the coordinator's noise is added, so the noise would not cover it; use fedavg or "
            "fedprox with --dp central (or --dp local or sample with an adaptive strategy)"
        )
    return None


@_rule("schedule", "dp", federated=True, says="the privacy ledger counts synchronous rounds")
def _async_dp(o: Options) -> str | None:
    if o["schedule"] == "async" and o["dp"] in ("local", "sample"):
        return (
            f"--dp {o['dp']} with --schedule async: the privacy ledger counts the sites' "
            "noised updates round by round, which an asynchronous schedule does not keep "
            "to; use --schedule sync"
        )
    return None


@_rule("secure_agg", "clients_per_round", federated=True,
       says=f"a SecAgg+ round samples at least {MIN_SECAGG_COHORT} sites")  # fmt: skip
def _secagg_cohort(o: Options) -> str | None:
    return secagg_cohort_problem(o.cohort) if o["secure_agg"] else None


@_rule("stragglers", "strategy", "secure_agg", "clients_per_round", federated=True,
       says="SecAgg+ survives the stragglers a strategy drops")  # fmt: skip
def _stragglers_fit_secagg(o: Options) -> str | None:
    """Stragglers that the strategy drops leave SecAgg+ after sharing keys; more of them than
    a site may lose of its neighbours (``shares - threshold``) can halt every round."""
    if not o["secure_agg"] or secagg_cohort_problem(o.cohort) is not None:
        return None
    shares, threshold = derive_shares(o.cohort)
    stragglers, strategy = o["stragglers"], o["strategy"]
    dropped = round(stragglers * o.cohort)
    if strategy == "fedprox" or dropped <= shares - threshold:
        return None
    return (
        f"--stragglers {stragglers:g} drops {dropped} of the {o.cohort} sites of a round under "
        f"{strategy}, more than SecAgg+ ({shares} shares, threshold {threshold}) survives "
        f"({shares - threshold}); use --strategy fedprox (partial work counts), fewer "
        "stragglers, or --no-secure-agg"
    )


@_rule("private_evaluation", "secure_agg", federated=True,
       says="a private evaluation sums through SecAgg+")  # fmt: skip
def _private_evaluation_needs_secagg(o: Options) -> str | None:
    if o["private_evaluation"] and not o["secure_agg"]:
        return (
            "--private-evaluation sends the sites' figures through SecAgg+, which is off; "
            "drop --no-secure-agg or --private-evaluation"
        )
    return None


@_rule("private_evaluation", "evaluate_every", federated=True,
       says="a private evaluation evaluates")  # fmt: skip
def _private_evaluation_evaluates(o: Options) -> str | None:
    if o["private_evaluation"] and o["evaluate_every"] == 0:
        return "--private-evaluation with --evaluate-every 0 evaluates nothing; raise it"
    return None


@_rule("private_evaluation", "cross_site", federated=True,
       says="a private evaluation shows no site's own figures")  # fmt: skip
def _private_evaluation_not_cross_site(o: Options) -> str | None:
    if o["private_evaluation"] and o["cross_site"]:
        return (
            "--cross-site records each site's figures, which --private-evaluation keeps from "
            "the coordinator; pick one"
        )
    return None


@_rule("private_evaluation", "fraction_evaluate", federated=True,
       says=f"a private evaluation asks at least {MIN_SECAGG_COHORT} sites")  # fmt: skip
def _private_evaluation_cohort(o: Options) -> str | None:
    fraction = o["fraction_evaluate"]
    asked = max(1, int(o.sites * fraction))
    if o["private_evaluation"] and asked < MIN_SECAGG_COHORT:
        return (
            f"--fraction-evaluate {fraction:g} asks {asked} of {o.sites} sites, fewer than the "
            f"{MIN_SECAGG_COHORT} a private evaluation sums over; raise --fraction-evaluate "
            f"(or {o.sites_flag})"
        )
    return None


@_rule("site_speeds", "seed", federated=True, says="--site-speeds is a spread of speeds")
def _site_speeds_parse(o: Options) -> str | None:
    from fedweave.learning.site_speeds import SiteSpeeds

    if o["site_speeds"] is None:
        return None
    try:
        SiteSpeeds.parse(o["site_speeds"], o["seed"])
    except UserError as error:
        return str(error)
    return None


@_rule("simulated_deadline", "site_speeds", federated=True,
       says="a simulated deadline needs a simulated clock")  # fmt: skip
def _deadline_needs_clock(o: Options) -> str | None:
    if o["simulated_deadline"] is not None and o["site_speeds"] is None:
        return "--simulated-deadline needs a simulated clock: give --site-speeds too"
    return None


@_rule("site_speeds", "stragglers", federated=True, says="one way of making slow sites")
def _one_kind_of_slow(o: Options) -> str | None:
    if o["site_speeds"] is not None and o["stragglers"] > 0:
        return "--stragglers and --site-speeds both make slow sites; pick one"
    return None


@_rule("schedule", "buffer", "max_staleness", "server_lr", federated=True,
       says="--buffer, --max-staleness and --server-lr are for --schedule async")  # fmt: skip
def _async_options(o: Options) -> str | None:
    if o["schedule"] == "async":
        return None
    for name in ("buffer", "max_staleness", "server_lr"):
        if o[name] is not None:
            return f"{flag_name(name)} is for --schedule async; drop it or add that"
    return None


@_rule("schedule", "secure_agg", "buffer", federated=True,
       says=f"under SecAgg+ an async buffer holds at least {MIN_SECAGG_COHORT} sites")  # fmt: skip
def _secure_buffer(o: Options) -> str | None:
    if o["schedule"] == "async" and o["secure_agg"] and o.buffer < MIN_SECAGG_COHORT:
        return (
            f"--buffer {o.buffer}: under SecAgg+ each buffer is a SecAgg+ cohort, which needs "
            f"at least {MIN_SECAGG_COHORT} sites (with fewer, the sum reveals each site's "
            f"update); raise --buffer to {MIN_SECAGG_COHORT} or add --no-secure-agg"
        )
    return None


@_rule("schedule", "strategy", federated=True, says="async runs fedavg or fedprox")
def _async_strategy(o: Options) -> str | None:
    strategy = o["strategy"]
    if o["schedule"] == "async" and strategy not in ("fedavg", "fedprox"):
        return (
            f"--strategy {strategy} works on a round's whole cohort, which an asynchronous "
            "schedule never gathers; use fedavg or fedprox with --schedule async"
        )
    return None


@_rule("schedule", "dp", federated=True, says="central DP needs a round's cohort")
def _async_central_dp(o: Options) -> str | None:
    if o["schedule"] == "async" and o["dp"] == "central":
        return "central DP clips a round's cohort; --schedule async cannot use it"
    return None


@_rule("schedule", "buffer", "secure_agg", federated=True,
       says="an async buffer is at most the sites")  # fmt: skip
def _buffer_fits(o: Options) -> str | None:
    if o["schedule"] == "async" and o.buffer > o.sites:
        return (
            f"--buffer {o.buffer} is more than the {o.sites} sites; a model step could never "
            "gather it: lower --buffer"
        )
    return None


@_rule("schedule", "simulated_deadline", federated=True,
       says="a simulated deadline closes synchronous rounds")  # fmt: skip
def _async_has_no_deadline(o: Options) -> str | None:
    if o["schedule"] == "async" and o["simulated_deadline"] is not None:
        return (
            "--simulated-deadline closes synchronous rounds; an asynchronous schedule has none "
            "(bound old updates with --max-staleness)"
        )
    return None


@_rule("schedule", "clients_per_round", federated=True, says="async rounds sample no cohort")
def _async_samples_nobody(o: Options) -> str | None:
    if o["schedule"] == "async" and o["clients_per_round"] is not None:
        return (
            "--clients-per-round samples synchronous rounds; with --schedule async every site "
            "trains all the time"
        )
    return None


def _compression(o: Options):
    from fedweave.learning.compression import Compression

    return Compression.parse(o["compress"])


@_rule("compress", federated=True, says="--compress is none, fp16, int8 or topk:F")
def _compress_parses(o: Options) -> str | None:
    try:
        _compression(o)
    except UserError as error:
        return str(error)
    return None


@_rule("compress", "secure_agg", federated=True,
       says="SecAgg+ sends masked integers, not compressed updates")  # fmt: skip
def _compress_without_secagg(o: Options) -> str | None:
    compression = _compression(o)
    if compression.active and o["secure_agg"]:
        return (
            f"--compress {compression.spec}: under SecAgg+ sites send masked integers, not "
            "updates the coordinator could decode (docs/compression.md says how many bits "
            "SecAgg+ already sends); add --no-secure-agg or drop --compress"
        )
    return None


@_rule("compress", "dp", federated=True, says="central DP clips full, decoded updates")
def _compress_without_central_dp(o: Options) -> str | None:
    compression = _compression(o)
    if compression.active and o["dp"] == "central":
        return (
            f"--compress {compression.spec}: central DP clips each site's full update at the "
            "coordinator before it is decoded; use --dp local, or drop --compress"
        )
    return None


@_rule("clients", gossip=True, says="a gossip simulation runs 2 peers or more")
def _gossip_needs_two(o: Options) -> str | None:
    return "a gossip simulation needs --clients 2 or more" if o["clients"] < 2 else None


@_rule("compress", gossip=True, says="gossip peers compress whole models: fp16 or int8")
def _gossip_compression(o: Options) -> str | None:
    return gossip_compression_problem(o["compress"])


def gossip_compression_problem(spec: str) -> str | None:
    """Why gossip peers cannot send their models compressed as ``spec``, or None."""
    from fedweave.learning.compression import Compression

    try:
        kind = Compression.parse(spec).kind
    except UserError as error:
        return str(error)
    if kind in ("none", "fp16", "int8"):
        return None
    return (
        f"--compress {spec}: gossip peers send whole models, which fp16 or int8 compress; "
        "top-k is for federated updates. Use --compress fp16 or int8"
    )


@_rule("min_replies", "clients_per_round", federated=True,
       says="a round aggregates at most the sites it samples")  # fmt: skip
def _min_replies_fit(o: Options) -> str | None:
    min_replies = o["min_replies"]
    if min_replies is not None and min_replies > o.cohort:
        return (
            f"--min-replies {min_replies} is more than the {o.cohort} sites sampled per round; "
            "lower it or sample more sites (--clients-per-round, --min-clients)"
        )
    return None
