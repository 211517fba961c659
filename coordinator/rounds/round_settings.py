"""What a run's rounds run with (``ServerSettings``: cohort, buffer, deadline, what each site
is told).

Three processes read it: ``fedweave coordinator`` and ``fedweave simulate`` size a run's
deadline before it starts (``command/training_setup.py``, ``command/run_header.py``,
``simulations/``), and the round loop runs with it (``round_app.py``, ``fedbuff.py``). It
only computes from the config and the task: no round runs here, and nothing is checked here
(the options' rules: ``fedweave/config/rules.py``; the run's inputs:
``command/run_checks.py``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedweave.config import RunConfig
from fedweave.config.cohorts import async_buffer, round_cohort
from fedweave.contract import (
    ADAPTER_KEY,
    BASE_SHA256_KEY,
    BATCH_SIZE_KEY,
    CLIP_GRAD_NORM_KEY,
    COMPRESS_KEY,
    DELIVERY_ALLOWANCE_KEY,
    DROPS_PARTIAL_WORK_KEY,
    LOCAL_EPOCHS_KEY,
    LOCAL_LAYERS_KEY,
    LR_KEY,
    MAX_CLOCK_SKEW_KEY,
    MAX_NORM_KEY,
    OPTIMIZER_KEY,
    PERSONAL_RUN_KEY,
    ROUND_KEY,
    SECAGG_CLIP_KEY,
    SECAGG_MAX_WEIGHT_KEY,
    SECAGG_VECTOR_ARRAYS_KEY,
    SEED_KEY,
    SIMULATED_DEADLINE_KEY,
    SITE_SPEEDS_KEY,
    TASK_PACKAGE_KEY,
    WEIGHT_DECAY_KEY,
)
from fedweave.coordinator.rounds.deadlines import (
    NO_DATA_DEADLINE_SECONDS,
    RoundDeadline,
    default_round_timeout,
)
from fedweave.coordinator.rounds.privacy import local_dp_config, sample_dp_config
from fedweave.coordinator.rounds.secure_agg import SecAggSettings
from fedweave.learning.compression import Compression
from fedweave.learning.statistics import prepared
from fedweave.learning.task_metrics import task_metrics
from fedweave.learning.tasks import load_task


@functools.lru_cache(maxsize=8)
def task_package_config(spec: str) -> dict[str, str]:
    """The round config's pin of task ``spec``'s installed package (``TASK_PACKAGE_KEY``),
    empty for a built-in or ``module:attr`` task; read once a process."""
    from fedweave.learning.task_packages import pinned_package

    pinned = pinned_package(spec)
    return {TASK_PACKAGE_KEY: json.dumps(pinned, sort_keys=True)} if pinned else {}


def adapter_config(config: RunConfig) -> dict[str, str]:
    """The round config's adapter of a ``--peft lora`` run (``ADAPTER_KEY``, and the base's
    sha256), empty otherwise; computed once a process."""
    training = config.training
    if training.peft == "none":
        return {}
    return dict(
        _adapter_config(
            config.data.task, training.lora_rank, training.lora_alpha, training.lora_targets,
            str(training.initial_model),
        )  # fmt: skip
    )


@functools.lru_cache(maxsize=4)
def _adapter_config(
    task: str, rank: int | None, alpha: float | None, targets: str | None, base: str
) -> tuple[tuple[str, str], ...]:
    from fedweave.learning.adapters import adapter_spec, declared_lora
    from fedweave.learning.initial_model import file_sha256

    loaded = load_task(task)
    spec = adapter_spec(
        loaded.build_model(), rank, alpha, targets, task, declared_lora(loaded, task)
    )
    return ((ADAPTER_KEY, spec.encode()), (BASE_SHA256_KEY, file_sha256(Path(base))))


def personal_config(config: RunConfig, run_id: str) -> dict[str, str]:
    """The round config of a run whose task keeps local layers at the sites
    (``LOCAL_LAYERS_KEY``, and the run id that names each site's file of them), empty
    otherwise."""
    from fedweave.learning.personal import task_local_layers

    layers = task_local_layers(config.data.task)
    if not layers:
        return {}
    return {LOCAL_LAYERS_KEY: ",".join(layers), PERSONAL_RUN_KEY: run_id or "run"}


@dataclass(frozen=True)
class ServerSettings:
    """What one coordinator process runs.

    Attributes:
        config: the run's settings (task, training, federation, secure aggregation, privacy;
            ``fedweave/config/sections.py``).
        min_clients: sites that must be connected before round 1 (all sites in simulation).
        rounds: rounds to run in this process (after a resume: the remaining ones).
        round_offset: rounds already completed before this process (resume; default 0).
        run_id: the history's run id (names each site's file of a task's local layers;
            default: none recorded, ``"run"``).
    """

    config: RunConfig
    min_clients: int
    rounds: int
    round_offset: int = 0
    run_id: str = ""

    @property
    def cohort(self) -> int:
        return round_cohort(self.config.federation.clients_per_round, self.min_clients)

    @property
    def secure_agg(self) -> bool:
        return self.config.secure_aggregation.secure_agg

    @property
    def secagg(self) -> SecAggSettings:
        return SecAggSettings(timeout=self.config.secure_aggregation.secagg_timeout)

    @property
    def training_secagg(self) -> SecAggSettings:
        """SecAgg+ for training rounds: under central DP ``max_weight`` 1, so every site's
        update weighs the same in the sum (the noise is sized for a mean of equals)."""
        if self.config.privacy.dp != "central":
            return self.secagg
        return replace(self.secagg, max_weight=1.0)

    @property
    def site_speeds(self):
        """The run's ``SiteSpeeds`` (``--site-speeds``), or None: no simulated clock."""
        from fedweave.learning.site_speeds import SiteSpeeds

        spec = self.config.simulation.site_speeds
        return None if spec is None else SiteSpeeds.parse(spec, self.config.training.seed)

    @property
    def buffer(self) -> int:
        """Async: site updates per model step (``--buffer``, or its default: ``cohorts.py``)."""
        return async_buffer(self.config.federation.buffer, self.min_clients, self.secure_agg)

    @property
    def compression(self) -> Compression:
        """The run's ``--compress`` (a spec that does not parse: its one line)."""
        return Compression.parse(self.config.federation.compress)

    @property
    def downlink(self) -> str:
        """How the global model goes to the sites (``--downlink``): ``full`` or ``fp16``."""
        return self.config.federation.downlink

    def deadline(self, test_data: Any) -> RoundDeadline:
        """``--round-timeout``, or the default sized from the task (``deadlines.py``) on the
        coordinator's held-out data, or, without any, ``NO_DATA_DEADLINE_SECONDS`` measured
        down from the sites' reported training times."""
        given = self.config.federation.round_timeout
        if given is not None:
            return RoundDeadline(given)
        if test_data is None or len(test_data) == 0:
            return RoundDeadline(NO_DATA_DEADLINE_SECONDS, measured=True)
        from fedweave.learning.training import TrainConfig  # torch: only to time the task

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
            **task_package_config(self.config.data.task),
            **adapter_config(self.config),
            **personal_config(self.config, self.run_id),
        }

    def fit_config(self, server_round: int, round_timeout: float) -> dict[str, int | float | str]:
        """What every sampled site is told for ``server_round`` (Flower's numbering), in a
        round that closes ``round_timeout`` seconds after it starts: ``_exchange_config``
        and, under ``--dp local``, the noise its update gets (``--dp sample``: DP-SGD's)."""
        config = self._exchange_config(server_round, round_timeout, self.training_secagg)
        config.update(local_dp_config(self.config.privacy))
        config.update(sample_dp_config(self.config.privacy))
        return config

    def statistics_config(self, round_timeout: float) -> dict[str, int | float | str]:
        """What the sites are told for the federated statistics before round 1 (round 0):
        never ``--dp local``'s noise, which is sized for a model update (a clipping norm of
        1 and noise for it) and turned a table's feature means into values like -6.5e13.
        So ``--dp local`` noises model updates only; under SecAgg+ the coordinator sees the
        statistics as their mean across sites."""
        return self._exchange_config(-self.round_offset, round_timeout, self.secagg)

    def _exchange_config(
        self, server_round: int, round_timeout: float, secagg: SecAggSettings
    ) -> dict[str, int | float | str]:
        """The config of one fit exchange: training, SecAgg+ (``secagg``), clock and
        compression."""
        training = self.config.training
        config: dict[str, int | float | str] = {
            **task_package_config(self.config.data.task),
            **adapter_config(self.config),
            **personal_config(self.config, self.run_id),
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
            config[SECAGG_CLIP_KEY] = secagg.clipping_range
            config[SECAGG_MAX_WEIGHT_KEY] = secagg.max_weight
            config[SECAGG_VECTOR_ARRAYS_KEY] = True
        speeds = self.site_speeds
        if speeds is not None:
            config[SITE_SPEEDS_KEY] = speeds.spec
            deadline = self.config.simulation.simulated_deadline
            if deadline is not None:
                config[SIMULATED_DEADLINE_KEY] = deadline
                config[DROPS_PARTIAL_WORK_KEY] = self.config.federation.strategy != "fedprox"
        if self.compression.active:
            config[COMPRESS_KEY] = self.compression.spec
        return config


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
