"""The Flower ClientApp: a NumPyClient that trains the task on this site's data only.

Where the site's data comes from, in order: the SuperNode's ``--node-config data-path=...``
(deployment), an explicit file in the settings, or ``site-<partition-id>.npz`` in a split
directory (simulation).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context

from fedweave.client.mods import site_mods
from fedweave.contract import (
    ADAPTER_KEY,
    BASE_SHA256_KEY,
    BATCH_SIZE_KEY,
    CLIP_GRAD_NORM_KEY,
    COMPRESS_KEY,
    DP_MODE_KEY,
    DROPS_PARTIAL_WORK_KEY,
    JOB_KEY,
    LOCAL_DP_KEYS,
    LOCAL_EPOCHS_KEY,
    LOCAL_LAYERS_KEY,
    LR_KEY,
    NODE_DATA_PATH_KEY,
    NODE_PARTITION_KEY,
    OPTIMIZER_KEY,
    PERSONAL_RUN_KEY,
    PRIVATE_EVALUATION_KEY,
    PROXIMAL_MU_KEY,
    ROUND_KEY,
    SAMPLE_DP_EPSILON_METRIC,
    SAMPLE_DP_KEYS,
    SECAGG_CLIP_KEY,
    SECAGG_MAX_WEIGHT_KEY,
    SEED_KEY,
    SIMULATED_DEADLINE_KEY,
    SIMULATED_SECONDS_METRIC,
    SITE_NAME_METRIC,
    SITE_SPEEDS_KEY,
    STATISTICS_KEY,
    STATISTICS_STAGE_KEY,
    TASK_PACKAGE_KEY,
    WEIGHT_DECAY_KEY,
    WORK_FRACTION_KEY,
    LateWork,
    SiteOutcome,
    SiteRefusal,
)
from fedweave.errors import UserError
from fedweave.learning.compression import Compression
from fedweave.learning.data import load_site_data
from fedweave.learning.evaluation_split import hold_out
from fedweave.learning.statistics import bound_problem, decode_known, digest, needs_statistics
from fedweave.learning.task import Task
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import adopt_weights, adopts_weights, get_weights, weights_view

if TYPE_CHECKING:
    from fedweave.learning.site_processes import SiteProcesses


@dataclass(frozen=True)
class ClientSettings:
    """How a site trains.

    Attributes:
        task: task name or ``module:attr``.
        data_path: this site's data file (deployment).
        split_dir: directory of ``site-<i>.npz`` files (simulation; ``i`` = partition id).
        site_files: the user's own site files (``simulate --data-dir``): site ``i`` reads
            the ``i``-th; takes precedence over ``split_dir``.
        site_names: simulated site ``i``'s name in the history (default: none, the node id).
        label_column: label column for CSV data.
        columns: the path of this site's column map (``--columns map.toml``: its table's
            headers → the task's columns), for a task that reads tables.
        eval_data_path: this site's own evaluation file (default: none).
        eval_fraction: share of the site's data held out to evaluate on when it has no
            evaluation file (default 0.1; 0: the site does not evaluate).
        device: ``cuda``/``cpu``/``None`` (auto).
        torch_threads: intra-op threads per client (simulations run several per machine).
        ledger_dir: where simulated site ``i`` keeps its own sample-level DP ledger
            (``site-<i>.privacy-ledger.json``; default: none, in memory for one message).
        base_model: a ``--peft lora`` run's base model file (simulation: the run's
            ``--initial-model``, which every simulated site reads).
        layers_dir: where simulated site ``NAME`` keeps the local layers of a task that
            declares them (``NAME/<run id>.safetensors``; default: none, and such a run is
            refused).
    """

    task: str
    data_path: str | None = None
    split_dir: str | None = None
    site_files: tuple[str, ...] = ()
    site_names: tuple[str, ...] = ()
    label_column: str | None = None
    columns: str | None = None
    eval_data_path: str | None = None
    eval_fraction: float = 0.1
    device: str | None = None
    torch_threads: int | None = None
    ledger_dir: str | None = None
    base_model: str | None = None
    layers_dir: str | None = None


@lru_cache(maxsize=4)
def cached_task(spec: str) -> Task:
    return load_task(spec)


_PREPARED: dict[tuple[int, str], tuple[Any, Any]] = {}
"""(site data, the same as the task trains on it) by (``id`` of the site data, statistics
digest); each entry holds its site data, so that id cannot be reused while it is here."""


@lru_cache(maxsize=8)
def cached_site_data(
    path: str, task_spec: str, label_column: str | None, columns: str | None = None
) -> Any:
    """``load_site_data`` once per file (``columns``: the column map's path)."""
    return load_site_data(path, cached_task(task_spec), label_column, columns)


@lru_cache(maxsize=8)
def cached_site_parts(
    path: str,
    task_spec: str,
    label_column: str | None,
    eval_path: str | None,
    eval_fraction: float,
    columns: str | None = None,
) -> tuple[Any, Any | None]:
    """(what the site trains on, what it evaluates on): its ``--eval-data`` file, or
    ``eval_fraction`` of its data held out (``fedweave/learning/evaluation_split.py``);
    ``columns``: the column map's path, applied to both files."""
    data = cached_site_data(path, task_spec, label_column, columns)
    if eval_path:
        return data, cached_site_data(eval_path, task_spec, label_column, columns)
    return hold_out(data, eval_fraction)


REPORTED_UNDER_DP = frozenset({
    SITE_NAME_METRIC, SIMULATED_SECONDS_METRIC, SAMPLE_DP_EPSILON_METRIC, "dp_delta", "seconds",
    "nonfinite",
})  # fmt: skip
"""What a training reply says beside its update under any ``--dp``: no exact example count
(central and local DP: 1, every site weighs alike; sample DP: rounded up to whole batches,
``batch_bucket``) and no training metrics, which no ledger covers and which tell
neighbouring datasets apart; the site's name, its own epsilon, whether training diverged and
its seconds (which the coordinator sees anyway, as the reply's time) stay."""


def batch_bucket(examples: int, batch_size: int) -> int:
    """A sample-DP site's example count as its reply says it: rounded up to whole batches.
    Its epsilon, which it reports, already tells its batches an epoch (its Poisson rate is 1
    / batches), so this count says nothing more about its data than that figure does."""
    return math.ceil(examples / batch_size) * batch_size


def count_as_sent(count: int, config: dict) -> int:
    """The example count a fit reply says: under SecAgg+ at most the run's ``max_weight``
    (Flower's mod scales the vector by count / ``max_weight``, which must not pass 1, and the
    coordinator refuses a higher count before the sum), else ``count`` itself."""
    if SECAGG_MAX_WEIGHT_KEY not in config:
        return count
    return min(count, int(float(config[SECAGG_MAX_WEIGHT_KEY])))


def resolve_data_path(settings: ClientSettings, context: Context) -> str:
    """Which file this site trains on (see the module docstring for the order)."""
    configured = context.node_config.get(NODE_DATA_PATH_KEY)
    if configured:
        return str(configured)
    if settings.data_path:
        return settings.data_path
    partition = int(context.node_config.get(NODE_PARTITION_KEY, 0))
    if settings.site_files:
        return settings.site_files[partition]
    if settings.split_dir is None:
        raise ValueError("no data: give the site a data file (--data)")
    return str(Path(settings.split_dir) / f"site-{partition}.npz")


def _check_task_package(config: dict) -> None:
    """Refuse a run whose pinned task package (``TASK_PACKAGE_KEY``) this site does not
    have in that version (``task_packages.package_problem``)."""
    text = config.get(TASK_PACKAGE_KEY)
    if not text:
        return
    from fedweave.learning.task_packages import package_problem

    try:
        pinned = json.loads(str(text))
    except ValueError:
        raise SiteRefusal("the run's task package pin is not JSON; run fedweave's own "
                          "coordinator") from None  # fmt: skip
    problem = package_problem(pinned if isinstance(pinned, dict) else None)
    if problem is not None:
        raise SiteRefusal(problem)


@lru_cache(maxsize=2)
def cached_adapted_task(task: Task, adapter: str, base_model: str | None, base_sha256: str) -> Any:
    """``task`` adapted as the run says (``adapters.adapted_task``), its base read and checked
    once a process; a base that is missing or is not the run's is the site's refusal, naming
    both hashes."""
    from fedweave.learning.adapters import adapted_task

    try:
        return adapted_task(
            task, adapter, Path(base_model) if base_model else None, getattr(task, "name", "?"),
            base_sha256,
        )  # fmt: skip
    except UserError as exc:  # the file's name only: where it lies is this site's business
        shown = str(exc).splitlines()[0]
        if base_model:
            shown = shown.replace(str(Path(base_model)), Path(base_model).name)
        raise SiteRefusal(shown) from None
    except ValueError as exc:  # the coordinator's adapter line does not parse
        raise SiteRefusal(f"the run's adapter is not one this site reads ({exc})") from None


class TaskClient(NumPyClient):
    """Trains ``task`` on ``data`` starting from the weights the coordinator sends, and scores
    the global model on ``evaluation`` (the site's evaluation part; ``None``: it has none,
    and says so when asked to evaluate).

    A simulated straggler (``WORK_FRACTION_KEY`` below 1) runs only that share of its local
    steps; when the strategy drops partial work it answers ``late`` instead, as a site still
    training at the deadline would be recorded.
    """

    def __init__(
        self,
        task: Task,
        data: Any,
        config: TrainConfig,
        site_index: int,
        node_id: int = 0,
        site_name: str | None = None,
        evaluation: Any | None = None,
        ledger_path: str | None = None,
        max_epsilon: float | None = None,
        max_delta: float | None = None,
        base_model: str | None = None,
        layers_dir: str | None = None,
        processes: SiteProcesses | None = None,
    ) -> None:
        self.processes = processes
        self.base_model = base_model
        self.layers_dir = layers_dir
        self.site_layers: Any = None
        self.layers_loaded = False
        self.ledger_path = ledger_path
        self.max_epsilon = max_epsilon
        self.max_delta = max_delta
        self.task = task
        self.data = data
        self.evaluation = evaluation
        self.config = config
        self.site_index = site_index
        self.node_id = node_id
        self.site_name = site_name
        self.model = task.build_model()

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        return get_weights(self.model)

    def _adapt(self, config: dict) -> None:
        """In a ``--peft lora`` run (``ADAPTER_KEY``), train and score the task's model on
        this site's base (``base_model``, checked against the run's ``BASE_SHA256_KEY``) with
        the run's adapters: the messages' tensors are the adapter's alone."""
        adapter = config.get(ADAPTER_KEY)
        if adapter is None:
            return
        self.task = cached_adapted_task(
            self.task, str(adapter), self.base_model, str(config.get(BASE_SHA256_KEY, ""))
        )
        self.model = self.task.build_model()

    def _personalize(self, config: dict) -> None:
        """In a run whose task keeps local layers at the sites (``LOCAL_LAYERS_KEY``), the
        messages' tensors are the shared ones; this site's own layers are read from its file
        of the run (``SiteLayers``, kept until the next round) or, in its first round, the
        model's start."""
        from fedweave.learning.personal import PersonalTask, SiteLayers, declared_local_layers

        if isinstance(self.task, PersonalTask):  # this client read its layers already
            return
        layers = config.get(LOCAL_LAYERS_KEY)
        declared = declared_local_layers(self.task)
        if layers is None:
            if declared:
                raise SiteRefusal(
                    f"task '{self.task.name}' here keeps layers {', '.join(declared)} at the "
                    "site, but the run shares every tensor; install the coordinator's task code"
                )
            return
        if tuple(str(layers).split(",")) != declared:
            raise SiteRefusal(
                f"the run keeps layers {layers} at the sites, this site's task "
                f"'{self.task.name}' declares {', '.join(declared) or 'none'}; install the "
                "coordinator's task code here"
            )
        if not self.layers_dir:
            raise SiteRefusal(
                "this run keeps layers at each site and this site has no folder for them; "
                "start it with --personal-state DIR"
            )
        try:
            self.site_layers = SiteLayers(Path(self.layers_dir), str(config.get(PERSONAL_RUN_KEY)))
        except ValueError as exc:
            raise SiteRefusal(f"the run's id for its local layers is not one ({exc})") from None
        self.task = PersonalTask(self.task, declared)
        torch.manual_seed(int(config.get(SEED_KEY, 0)))  # the layers' start, the same everywhere
        self.model = self.task.build_model()
        try:
            self.layers_loaded = self.site_layers.load_into(self.model)
        except Exception as exc:  # a file of another model: say which, train nothing
            raise SiteRefusal(
                f"this site's local layers {self.site_layers.path.name} do not fit the run's "
                f"model ({str(exc).splitlines()[0][:160]}); move that file away to start them anew"
            ) from None

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        _check_task_package(config)
        self._refuse_what_processes_cannot(config)
        self._adapt(config)
        self._personalize(config)
        work = float(config.get(WORK_FRACTION_KEY, 1.0))
        simulated = None
        if SITE_SPEEDS_KEY in config and not config.get(STATISTICS_STAGE_KEY):
            work, simulated = self._simulated_job(parameters, config)
        if work < 1.0 and bool(config.get(DROPS_PARTIAL_WORK_KEY, False)):
            raise LateWork(
                f"simulated straggler: {100 * work:.0f}% of its local work done by the "
                "deadline, and the strategy drops partial work",
            )
        stage = config.get(STATISTICS_STAGE_KEY)
        if stage:
            return self._statistics(str(stage), parameters, config)
        if config.get(PRIVATE_EVALUATION_KEY):
            return self._private_evaluation(parameters, config)
        data = self._prepared(config, self.data)
        self._refuse_delta_over_cap(config, len(data))
        self._load_global(parameters)
        round_seed = (
            int(config.get(SEED_KEY, 0)) * 1_000_003
            + int(config.get(ROUND_KEY, 0)) * 1009
            + int(config.get(JOB_KEY, 0)) * 7919
        )
        train_config = replace(
            self.config,
            epochs=int(config.get(LOCAL_EPOCHS_KEY, self.config.epochs)),
            lr=float(config.get(LR_KEY, self.config.lr)),
            optimizer=str(config.get(OPTIMIZER_KEY, self.config.optimizer)),
            weight_decay=float(config.get(WEIGHT_DECAY_KEY, self.config.weight_decay)),
            clip_grad_norm=(
                float(config[CLIP_GRAD_NORM_KEY])
                if CLIP_GRAD_NORM_KEY in config
                else self.config.clip_grad_norm
            ),
            batch_size=int(config.get(BATCH_SIZE_KEY, self.config.batch_size)),
            seed=round_seed + self.site_index,
            proximal_mu=float(config.get(PROXIMAL_MU_KEY, 0.0)),
            work_fraction=work,
        )
        if self.processes is not None:
            metrics = self._train_across_processes(train_config, config)
        elif SAMPLE_DP_KEYS[0] in config:
            metrics = self._train_with_sample_dp(data, train_config, config)
        else:
            metrics = dict(self.task.train(self.model, data, train_config))
        if self.site_name:
            metrics[SITE_NAME_METRIC] = self.site_name
        if simulated is not None:
            metrics[SIMULATED_SECONDS_METRIC] = simulated
        if self.site_layers is not None:
            if not all(bool(torch.isfinite(t).all()) for t in self.model.personal_state().values()):
                raise SiteRefusal(
                    "training took this site's local layers to NaN or infinity; its previous "
                    "ones are kept (a lower --lr may help)"
                )
            self.site_layers.save(self.model)
        # read out without a copy where the next load gives the model new tensors anyway:
        # Flower serialises the reply from them before anything else runs
        weights = (
            weights_view(self.model) if adopts_weights(self.model) else get_weights(self.model)
        )
        mode = str(config.get(DP_MODE_KEY, "none"))
        if mode != "none":
            metrics = {k: v for k, v in metrics.items() if k in REPORTED_UNDER_DP}
            count = batch_bucket(len(data), train_config.batch_size) if mode == "sample" else 1
            return weights, count_as_sent(count, config), metrics
        return weights, count_as_sent(len(data), config), metrics

    def _refuse_delta_over_cap(self, config: dict, examples: int) -> None:
        """Refuse a local- or sample-DP round whose delta is above this site's cap
        (``--max-delta``, else 1 / (10 x its examples)), before anything trains."""
        from fedweave.privacy.delta import delta_problem

        for key in (LOCAL_DP_KEYS[3], SAMPLE_DP_KEYS[2]):
            if key in config:
                problem = delta_problem(float(config[key]), examples, self.max_delta)
                if problem is not None:
                    raise SiteRefusal(problem)

    def _refuse_what_processes_cannot(self, config: dict) -> None:
        """A site training across processes refuses, before it loads anything for them, the
        runs its ranks cannot serve yet."""
        if self.processes is None:
            return
        kept_apart = (
            (ADAPTER_KEY, "adapters (--peft lora)"), (LOCAL_LAYERS_KEY, "layers kept at the sites"),
            (SAMPLE_DP_KEYS[0], "--dp sample"),
        )  # fmt: skip
        for key, what in kept_apart:
            if key in config:
                raise SiteRefusal(
                    f"this site trains across {self.processes.nproc} processes "
                    f"(--nproc-per-node), which runs with {what} do not support yet; restart it "
                    "with --nproc-per-node 1 to take part"
                )

    def _train_across_processes(self, train_config: TrainConfig, config: dict) -> dict:
        """This round's training in ``self.processes``' ranks (``--nproc-per-node``); a rank
        that fails or stalls fails the site's round, with the rank and the reason."""
        from fedweave.learning.site_processes import SiteProcessesFailed, train_across_processes

        statistics = str(config[STATISTICS_KEY]) if needs_statistics(self.task) else None
        try:
            return train_across_processes(self.processes, self.model, train_config, statistics)
        except SiteProcessesFailed as exc:
            raise SiteOutcome(str(exc)) from None

    def _train_with_sample_dp(self, data: Any, train_config: TrainConfig, config: dict) -> dict:
        """DP-SGD (``--dp sample``) under this site's own ledger: refused, before training,
        when the run's delta guarantees nothing for this site's examples or when the round
        would take the ledger past the site's ``--max-epsilon``."""
        from fedweave.learning.sample_dp import (
            SampleDp,
            SiteLedger,
            round_steps,
            train_with_sample_dp,
        )
        from fedweave.learning.training import objective_of

        multiplier, max_grad_norm, delta = (float(config[key]) for key in SAMPLE_DP_KEYS)
        if not self.ledger_path:  # in memory, each round would count from zero
            raise SiteRefusal(
                "this site keeps no privacy ledger, so it cannot account for --dp sample; "
                "give it one: fedweave client --privacy-ledger PATH"
            )
        try:
            ledger = SiteLedger(Path(self.ledger_path))
            ledger.record(ledger.history)  # writable before training, not after
        except UserError as exc:
            raise SiteRefusal(str(exc)) from None
        if self.max_epsilon is not None:
            rate, steps = round_steps(len(data), train_config)
            after = ledger.epsilon(delta, [(multiplier, rate, steps)])
            if after > self.max_epsilon:
                raise SiteRefusal(
                    f"this site allows at most epsilon {self.max_epsilon:g} (--max-epsilon), "
                    f"but this round would take its own ledger from "
                    f"{ledger.epsilon(delta):.3f} to {after:.3f} (delta {delta:g}); restart "
                    "this site without that floor to take part"
                )
        return train_with_sample_dp(
            self.model, data, replace(train_config, proximal_mu=0.0), objective_of(self.task),
            SampleDp(multiplier, max_grad_norm, delta), ledger,
        )  # fmt: skip

    def _simulated_job(self, parameters: list[np.ndarray], config: dict) -> tuple[float, float]:
        """(share of its local work this site does, simulated seconds its job takes) on the
        run's simulated clock (``--site-speeds``): a site too slow for the simulated deadline
        does the part that fits (FedProx) or answers ``late`` (a strategy that drops partial
        work)."""
        from fedweave.learning.site_speeds import MIN_WORK_FRACTION, SiteSpeeds, share_done_by

        speeds = SiteSpeeds.parse(str(config[SITE_SPEEDS_KEY]), int(config.get(SEED_KEY, 0)))
        epochs = int(config.get(LOCAL_EPOCHS_KEY, self.config.epochs))
        model_bytes = sum(int(np.asarray(p).nbytes) for p in parameters)
        update_bytes = Compression.parse(str(config.get(COMPRESS_KEY) or "none")).sent_bytes(
            parameters
        )
        training, transfer = speeds.compute_and_link(
            self.site_name or str(self.site_index), len(self.data), epochs, model_bytes,
            update_bytes,
        )  # fmt: skip
        deadline = config.get(SIMULATED_DEADLINE_KEY)
        if deadline is None:
            return 1.0, training + transfer
        share = share_done_by(float(deadline), training, transfer)
        if share >= 1.0:
            return 1.0, training + transfer
        if bool(config.get(DROPS_PARTIAL_WORK_KEY, False)) or share <= 0.0:
            raise LateWork(
                f"simulated: its job takes {training + transfer:.1f} s of the simulated "
                f"deadline's {float(deadline):g} s, and the strategy drops partial work"
            )
        return max(share, MIN_WORK_FRACTION), float(deadline)

    def _prepared(self, config: dict, data: Any) -> Any:
        """``data`` (the site's training or evaluation part) as the task reads it, with the
        run's federated statistics (refused when the task needs them and the run sent none,
        or its schema differs)."""
        if not needs_statistics(self.task):
            return data
        text = config.get(STATISTICS_KEY)
        if not text:
            raise SiteRefusal(
                f"task '{self.task.name}' standardises with federated statistics but the "
                "run sent none; run the coordinator's fedweave version"
            )
        known = decode_known(str(text))
        schema = getattr(self.task, "schema", None)
        if schema is not None and known.get("schema") not in (None, schema.digest()):
            raise SiteRefusal(
                f"this site's table schema ({schema.digest()}) differs from the run's "
                f"({known.get('schema')}); install the coordinator's task code here"
            )
        # A deployed site builds a new client per message: keep the prepared data per
        # (site data, statistics), not per client, so it is prepared once a run, not a round.
        key = (id(data), digest(known))
        if key not in _PREPARED:
            if len(_PREPARED) >= 8:
                _PREPARED.pop(next(iter(_PREPARED)))
            prepared = self.task.prepare(data, known)  # type: ignore[attr-defined]
            _PREPARED[key] = (data, prepared)
        return _PREPARED[key][1]

    def _statistics(
        self, stage: str, parameters: list[np.ndarray], config: dict
    ) -> tuple[list[np.ndarray], int, dict]:
        """This site's vector for one federated-statistics stage: a mean over its examples."""
        task: Any = self.task
        if not needs_statistics(task) or stage not in task.statistics_stages:
            raise SiteRefusal(f"task '{task.name}' has no statistics stage '{stage}'")
        known = decode_known(str(config.get(STATISTICS_KEY, "")))
        vector = np.asarray(task.local_statistics(self.data, stage, known), dtype=np.float32)
        if parameters and vector.shape != parameters[0].shape:
            raise SiteRefusal(
                f"statistics of stage '{stage}' have {vector.size} values, the run "
                f"expects {parameters[0].size}; install the coordinator's task code here"
            )
        if SECAGG_CLIP_KEY in config:
            share = count_as_sent(len(self.data), config) / float(config[SECAGG_MAX_WEIGHT_KEY])
            problem = bound_problem(vector, share, float(config[SECAGG_CLIP_KEY]))
            if problem is not None:
                raise SiteRefusal(f"statistics stage '{stage}': {problem}")
        return [vector], count_as_sent(len(self.data), config), {}

    def _load_global(self, parameters: list[np.ndarray]) -> None:
        """The round's global model into this site's; refused when the two models differ."""
        try:
            adopt_weights(self.model, parameters)  # Flower decoded them for this load alone
        except (ValueError, RuntimeError) as exc:
            problem = str(exc).strip().splitlines()[-1][:160]
            raise SiteRefusal(
                f"this site's model for task '{self.task.name}' differs from the "
                f"coordinator's ({problem}); install the coordinator's fedweave version "
                "and task code at this site"
            ) from None

    def _scores(self, parameters: list[np.ndarray], config: dict) -> tuple[dict, int]:
        """The task's evaluation of the global model on this site's evaluation part, and
        its example count."""
        if self.evaluation is None:
            raise SiteRefusal(
                "this site holds no evaluation data: start it with --eval-data FILE or an "
                "--eval-fraction above 0"
            )
        if self.site_layers is not None and not self.layers_loaded:
            raise SiteRefusal(
                "this site has no local layers of the run yet (it has not trained in it), so "
                "it has no model of its own to score"
            )
        data = self._prepared(config, self.evaluation)
        self._load_global(parameters)
        return self.task.evaluate(self.model, data, self.config), len(data)

    def _private_evaluation(
        self, parameters: list[np.ndarray], config: dict
    ) -> tuple[list[np.ndarray], int, dict]:
        """The metrics the run names (``PRIVATE_EVALUATION_KEY``), in its order, as the
        vector SecAgg+ masks in place of an update: only their sum leaves this site."""
        names = str(config[PRIVATE_EVALUATION_KEY]).split(",")
        scores, examples = self._scores(parameters, config)
        missing = [name for name in names if name not in scores]
        if missing:
            raise SiteRefusal(
                f"task '{self.task.name}' here does not compute {', '.join(missing)}, which "
                "the run's private evaluation sums; install the coordinator's task code"
            )
        vector = np.asarray([float(scores[name]) for name in names], dtype=np.float64)
        if SECAGG_CLIP_KEY in config:
            problem = bound_problem(
                vector, count_as_sent(examples, config) / float(config[SECAGG_MAX_WEIGHT_KEY]),
                float(config[SECAGG_CLIP_KEY]), what="metric",
            )  # fmt: skip
            if problem is not None:
                raise SiteRefusal(f"private evaluation: {problem}")
        metrics = {SITE_NAME_METRIC: self.site_name} if self.site_name else {}
        return [vector.astype(np.float32)], count_as_sent(examples, config), metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Every metric the task computes for the global model on this site's evaluation
        part, with its example count and (when named) the site's name."""
        _check_task_package(config)
        self._refuse_what_processes_cannot(config)
        self._adapt(config)
        self._personalize(config)
        started = time.perf_counter()
        scores, examples = self._scores(parameters, config)
        metrics: dict[str, Any] = {
            name: float(value) for name, value in scores.items()
            if name != "loss" and isinstance(value, (int, float)) and not isinstance(value, bool)
        }  # fmt: skip
        metrics["seconds"] = time.perf_counter() - started
        if self.site_name:
            metrics[SITE_NAME_METRIC] = self.site_name
        return float(scores["loss"]), examples, metrics


def make_client_app(settings: ClientSettings) -> ClientApp:
    """A ClientApp whose clients train ``settings.task`` on their own data file.

    The site mods (SecAgg+, update check, DP) switch on when the coordinator's round asks.
    """

    def client_fn(context: Context):
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        path = resolve_data_path(settings, context)
        data, evaluation = cached_site_parts(
            path, settings.task, settings.label_column, settings.eval_data_path,
            settings.eval_fraction, settings.columns,
        )  # fmt: skip
        site_index = int(context.node_config.get(NODE_PARTITION_KEY, 0))
        names = settings.site_names
        ledger = (
            str(Path(settings.ledger_dir) / f"site-{site_index}.privacy-ledger.json")
            if settings.ledger_dir
            else None
        )
        client = TaskClient(
            cached_task(settings.task), data,
            TrainConfig.for_task(cached_task(settings.task), device=settings.device), site_index,
            context.node_id, names[site_index] if site_index < len(names) else None, evaluation,
            ledger_path=ledger, base_model=settings.base_model,
            layers_dir=(
                str(Path(settings.layers_dir) / (names[site_index] if site_index < len(names)
                                                 else f"site-{site_index}"))
                if settings.layers_dir else None
            ),
        )  # fmt: skip
        return client.to_client()

    def site_name_of(context: Context) -> str | None:
        index = int(context.node_config.get(NODE_PARTITION_KEY, 0))
        return settings.site_names[index] if index < len(settings.site_names) else None

    return ClientApp(client_fn=client_fn, mods=site_mods(site_name_of))
