"""What a run's rounds run with (``ServerSettings``: cohort, deadline, what each site is told)
and the checks that refuse an impossible run before anything starts.

Three processes read it: ``fedweave coordinator`` and ``fedweave simulate`` check a run and
size its deadline before it starts (``command/supervisor.py``, ``command/run_header.py``,
``simulations/``), and the round loop runs with it (``round_app.py``, ``fedbuff.py``). It
only computes from the config and the task: no round runs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedweave.config import RunConfig
from fedweave.contract import (
    BATCH_SIZE_KEY,
    CLIP_GRAD_NORM_KEY,
    COMPRESS_KEY,
    DELIVERY_ALLOWANCE_KEY,
    DROPS_PARTIAL_WORK_KEY,
    LOCAL_EPOCHS_KEY,
    LR_KEY,
    MAX_CLOCK_SKEW_KEY,
    MAX_NORM_KEY,
    OPTIMIZER_KEY,
    ROUND_KEY,
    SECAGG_CLIP_KEY,
    SECAGG_MAX_WEIGHT_KEY,
    SEED_KEY,
    SIMULATED_DEADLINE_KEY,
    SITE_SPEEDS_KEY,
    WEIGHT_DECAY_KEY,
)
from fedweave.coordinator.rounds.deadlines import (
    NO_DATA_DEADLINE_SECONDS,
    RoundDeadline,
    default_round_timeout,
)
from fedweave.coordinator.rounds.privacy import check_privacy, local_dp_config
from fedweave.coordinator.rounds.secure_agg import (
    MIN_SECAGG_COHORT,
    SecAggSettings,
    derive_shares,
)
from fedweave.coordinator.rounds.strategies import check_strategy_choice
from fedweave.errors import UserError
from fedweave.learning.compression import Compression
from fedweave.learning.statistics import prepared
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig, task_metrics


@dataclass(frozen=True)
class ServerSettings:
    """What one coordinator process runs.

    Attributes:
        config: the run's settings (task, training, federation, secure aggregation, privacy;
            ``fedweave/config/sections.py``).
        min_clients: sites that must be connected before round 1 (all sites in simulation).
        rounds: rounds to run in this process (after a resume: the remaining ones).
        round_offset: rounds already completed before this process (resume; default 0).
    """

    config: RunConfig
    min_clients: int
    rounds: int
    round_offset: int = 0

    @property
    def cohort(self) -> int:
        return self.config.federation.clients_per_round or self.min_clients

    @property
    def secure_agg(self) -> bool:
        return self.config.secure_aggregation.secure_agg

    @property
    def secagg(self) -> SecAggSettings:
        return SecAggSettings(timeout=self.config.secure_aggregation.secagg_timeout)

    def check(self) -> None:
        """Refuse impossible combinations before anything starts (one-line UserErrors)."""
        check_strategy_choice(self.config.federation.strategy, self.secure_agg)
        check_privacy(self.config.privacy)
        if self.secure_agg:
            shares, threshold = derive_shares(self.cohort)
            self._check_stragglers_fit_secagg(shares, threshold)
        evaluation = self.config.evaluation
        asked = max(1, int(self.min_clients * evaluation.fraction_evaluate))
        if evaluation.private_evaluation and asked < MIN_SECAGG_COHORT:
            raise UserError(
                f"--fraction-evaluate {evaluation.fraction_evaluate:g} asks {asked} of "
                f"{self.min_clients} sites, fewer than the {MIN_SECAGG_COHORT} a private "
                "evaluation sums over; raise --fraction-evaluate (or --min-clients)"
            )
        self._check_schedule()
        self._check_compression()
        min_replies = self.config.federation.min_replies
        if min_replies is not None and min_replies > self.cohort:
            raise UserError(
                f"--min-replies {min_replies} is more than the {self.cohort} sites sampled "
                "per round; lower it or sample more sites (--clients-per-round, --min-clients)"
            )

    @property
    def site_speeds(self):
        """The run's ``SiteSpeeds`` (``--site-speeds``), or None: no simulated clock."""
        from fedweave.learning.site_speeds import SiteSpeeds

        spec = self.config.simulation.site_speeds
        return None if spec is None else SiteSpeeds.parse(spec, self.config.training.seed)

    @property
    def buffer(self) -> int:
        """Async: site updates per model step (``--buffer``; default a third of the sites,
        at least 2, under SecAgg+ at least 3, at most all)."""
        given = self.config.federation.buffer
        floor = MIN_SECAGG_COHORT if self.secure_agg else 2
        if given is not None:
            return given
        return min(self.min_clients, max(floor, self.min_clients // 3))

    def _check_schedule(self) -> None:
        """Refuse what the simulated clock and the asynchronous schedule cannot do."""
        federation, simulation = self.config.federation, self.config.simulation
        speeds = self.site_speeds  # a spec that does not parse: its one line
        if simulation.simulated_deadline is not None and speeds is None:
            raise UserError(
                "--simulated-deadline needs a simulated clock: give --site-speeds too"
            )
        if speeds is not None and simulation.stragglers > 0:
            raise UserError(
                "--stragglers and --site-speeds both make slow sites; pick one"
            )
        if federation.schedule != "async":
            for flag, value in (("--buffer", federation.buffer),
                                ("--max-staleness", federation.max_staleness),
                                ("--server-lr", federation.server_lr)):  # fmt: skip
                if value is not None:
                    raise UserError(f"{flag} is for --schedule async; drop it or add that")
            return
        if self.secure_agg and self.buffer < MIN_SECAGG_COHORT:
            raise UserError(
                f"--buffer {self.buffer}: under SecAgg+ each buffer is a SecAgg+ cohort, which "
                f"needs at least {MIN_SECAGG_COHORT} sites (with fewer, the sum reveals each "
                f"site's update); raise --buffer to {MIN_SECAGG_COHORT} or add --no-secure-agg"
            )
        if federation.strategy not in ("fedavg", "fedprox"):
            raise UserError(
                f"--strategy {federation.strategy} works on a round's whole cohort, which an "
                "asynchronous schedule never gathers; use fedavg or fedprox with --schedule async"
            )
        if self.config.privacy.dp == "central":
            raise UserError("central DP clips a round's cohort; --schedule async cannot use it")
        if self.buffer > self.min_clients:
            raise UserError(
                f"--buffer {self.buffer} is more than the {self.min_clients} sites; a model "
                "step could never gather it: lower --buffer"
            )
        if simulation.simulated_deadline is not None:
            raise UserError(
                "--simulated-deadline closes synchronous rounds; an asynchronous schedule has "
                "none (bound old updates with --max-staleness)"
            )
        if federation.clients_per_round is not None:
            raise UserError(
                "--clients-per-round samples synchronous rounds; with --schedule async every "
                "site trains all the time"
            )

    @property
    def compression(self) -> Compression:
        """The run's ``--compress`` (a spec that does not parse: its one line)."""
        return Compression.parse(self.config.federation.compress)

    def _check_compression(self) -> None:
        """Refuse compression where the coordinator never sees single updates to decode."""
        compression = self.compression
        if not compression.active:
            return
        if self.secure_agg:
            raise UserError(
                f"--compress {compression.spec}: under SecAgg+ sites send masked integers, "
                "not updates the coordinator could decode (docs/compression.md says how many "
                "bits SecAgg+ already sends); add --no-secure-agg or drop --compress"
            )
        if self.config.privacy.dp == "central":
            raise UserError(
                f"--compress {compression.spec}: central DP clips each site's full update at "
                "the coordinator before it is decoded; use --dp local, or drop --compress"
            )

    def _check_stragglers_fit_secagg(self, shares: int, threshold: int) -> None:
        """Stragglers that the strategy drops leave SecAgg+ after sharing keys; more of them
        than a site may lose of its neighbours (``shares - threshold``) can halt every round."""
        federation = self.config.federation
        dropped = round(self.config.simulation.stragglers * self.cohort)
        if federation.strategy == "fedprox" or dropped <= shares - threshold:
            return
        raise UserError(
            f"--stragglers {self.config.simulation.stragglers:g} drops {dropped} of the "
            f"{self.cohort} sites of a round under {federation.strategy}, more than SecAgg+ "
            f"({shares} shares, threshold {threshold}) survives ({shares - threshold}); use "
            "--strategy fedprox (partial work counts), fewer stragglers, or --no-secure-agg"
        )

    def deadline(self, test_data: Any) -> RoundDeadline:
        """``--round-timeout``, or the default sized from the task (``deadlines.py``) on the
        coordinator's held-out data, or, without any, ``NO_DATA_DEADLINE_SECONDS`` measured
        down from the sites' reported training times."""
        given = self.config.federation.round_timeout
        if given is not None:
            return RoundDeadline(given)
        if test_data is None or len(test_data) == 0:
            return RoundDeadline(NO_DATA_DEADLINE_SECONDS, measured=True)
        task = load_task(self.config.data.task)
        return RoundDeadline(
            default_round_timeout(
                task, prepared(task, test_data, None), TrainConfig.of(self.config.training, task)
            )
        )

    def resolved(self, deadline: RoundDeadline) -> RunConfig:
        """The config to record: a fixed deadline written in (a resumed run keeps it); a
        measured one left unset, so a resumed run measures again."""
        if deadline.measured:
            return self.config
        return self.config.replace(round_timeout=deadline.seconds)

    def strategy_options(self) -> dict[str, float]:
        """Settings of the chosen Flower strategy itself (FedProx's mu)."""
        if self.config.federation.strategy == "fedprox":
            return {"proximal_mu": self.config.federation.proximal_mu}
        return {}

    def evaluate_config(self, server_round: int) -> dict[str, int | float | str]:
        """What every site asked to evaluate after ``server_round`` is told."""
        training = self.config.training
        return {
            ROUND_KEY: server_round + self.round_offset,
            BATCH_SIZE_KEY: training.batch_size,
            SEED_KEY: training.seed,
        }

    def fit_config(self, server_round: int, round_timeout: float) -> dict[str, int | float | str]:
        """What every sampled site is told for ``server_round`` (Flower's numbering), in a
        round that closes ``round_timeout`` seconds after it starts."""
        training = self.config.training
        config: dict[str, int | float | str] = {
            ROUND_KEY: server_round + self.round_offset,
            LOCAL_EPOCHS_KEY: training.local_epochs,
            LR_KEY: training.lr,
            OPTIMIZER_KEY: training.optimizer,
            WEIGHT_DECAY_KEY: training.weight_decay,
            BATCH_SIZE_KEY: training.batch_size,
            SEED_KEY: training.seed,
            MAX_CLOCK_SKEW_KEY: self.config.deployment.max_clock_skew,
            DELIVERY_ALLOWANCE_KEY: round_timeout,
        }
        if training.clip_grad_norm is not None:
            config[CLIP_GRAD_NORM_KEY] = training.clip_grad_norm
        max_update_norm = self.config.federation.max_update_norm
        if max_update_norm is not None:
            config[MAX_NORM_KEY] = max_update_norm
        if self.secure_agg:
            config[SECAGG_CLIP_KEY] = self.secagg.clipping_range
            config[SECAGG_MAX_WEIGHT_KEY] = self.secagg.max_weight
        speeds = self.site_speeds
        if speeds is not None:
            config[SITE_SPEEDS_KEY] = speeds.spec
            deadline = self.config.simulation.simulated_deadline
            if deadline is not None:
                config[SIMULATED_DEADLINE_KEY] = deadline
                config[DROPS_PARTIAL_WORK_KEY] = self.config.federation.strategy != "fedprox"
        if self.compression.active:
            config[COMPRESS_KEY] = self.compression.spec
        config.update(local_dp_config(self.config.privacy))
        return config


def check_scoring(config: RunConfig, test_data: Any) -> None:
    """Refuse a run nothing would score: no test data at the coordinator and no federated
    evaluation; and a ``--select-metric`` the task does not compute (when it says which)."""
    evaluation = config.evaluation
    if test_data is None and evaluation.evaluate_every == 0:
        raise UserError(
            f"nothing would score the rounds: task '{config.data.task}' has no data at the "
            "coordinator and federated evaluation is off; give --test-data FILE or leave "
            "--evaluate-every at 1 or more"
        )
    known = task_metrics(load_task(config.data.task))
    if evaluation.private_evaluation:
        check_private_evaluation(config, known)
    if known is not None and evaluation.select_metric not in known:
        raise UserError(
            f"--select-metric {evaluation.select_metric}: task '{config.data.task}' computes "
            f"{', '.join(known)}; pick one of them"
        )


def check_private_evaluation(config: RunConfig, known: tuple[str, ...] | None) -> None:
    """Refuse a ``--private-evaluation`` that could not run, or would not be private."""
    evaluation, task = config.evaluation, config.data.task
    if not config.secure_aggregation.secure_agg:
        raise UserError(
            "--private-evaluation sends the sites' figures through SecAgg+, which is off; "
            "drop --no-secure-agg or --private-evaluation"
        )
    if evaluation.evaluate_every == 0:
        raise UserError("--private-evaluation with --evaluate-every 0 evaluates nothing; raise it")
    if evaluation.cross_site:
        raise UserError(
            "--cross-site records each site's figures, which --private-evaluation keeps from "
            "the coordinator; pick one"
        )
    if known is None:
        raise UserError(
            f"task '{task}' does not declare its metrics (a `metrics` tuple), which a private "
            "evaluation needs to lay out its sums; declare them or drop --private-evaluation"
        )


def private_metric_names(task: Any) -> tuple[str, ...]:
    """The vector a private evaluation sums: ``loss`` then the task's other declared
    metrics."""
    declared = task_metrics(task) or ()
    return ("loss", *(name for name in declared if name != "loss"))


def test_data_of(config: RunConfig):
    """The coordinator's held-out data, or ``None`` (``central_test_data``)."""
    from fedweave.learning.data import central_test_data

    return central_test_data(
        load_task(config.data.task), config.data.test_data, config.data.label_column
    )
