"""The reporting layer every fedweave strategy gets: update validation, per-site results,
central evaluation and a round summary for the listeners (history, progress, report).

``ReportingStrategy`` wraps one of Flower's legacy strategies (FedAvg, FedProx, FedAdam,
Krum, ...) and delegates to it, the way Flower's differential privacy wrappers do, so the
sampling and the aggregation themselves stay Flower's.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import ClientManager
from flwr.server.strategy import FedAdam, FedAvg, FedProx, FedYogi, Strategy

from fedweave.bulk.array_parts import HeldUpdate, UpdateInMemory, UpdateSource
from fedweave.bulk.records import parameter_views
from fedweave.contract import (
    CLIPPED_FRACTION_METRIC,
    COMPRESSION_METRIC,
    CROSS_SITE_MODEL_KEY,
    PROCESSES_METRIC,
    SITE_NAME_METRIC,
    UPLINK_BYTES_METRIC,
    bounded_site_metrics,
    one_line,
)
from fedweave.coordinator.rounds.deadlines import RoundDeadline
from fedweave.coordinator.rounds.federated_evaluation import (
    UnknownSite,
    failed_outcome,
    is_evaluation_round,
    site_evaluations,
    weighted_evaluation,
)
from fedweave.coordinator.rounds.privacy_ledger import BudgetSpent
from fedweave.coordinator.rounds.site_outcomes import SiteReplies, failure_said
from fedweave.coordinator.rounds.site_wait import ConnectedNow
from fedweave.coordinator.rounds.site_weights import bounded_results
from fedweave.coordinator.rounds.spooled_updates import SpooledError, SpooledUpdates
from fedweave.coordinator.rounds.streamed_mean import mean_tensors
from fedweave.coordinator.rounds.traffic import Traffic
from fedweave.flower_patches.default_workflow import ClientProxy
from fedweave.flower_patches.secagg_masks import unflatten
from fedweave.history.records import RoundInFlight, SiteResult
from fedweave.history.round_summary import RoundListener, RoundStartListener, RoundSummary
from fedweave.learning.compression import Compression, CompressionMismatch
from fedweave.learning.validation import update_problem

log = logging.getLogger("fedweave.coordinator")

CentralEvaluator = Callable[[list[np.ndarray]], dict[str, float]]

HEADLINE = ("loss", "accuracy")
"""The two figures every round line shows; every other metric is kept beside them."""
MEAN_STRATEGIES = (FedAvg, FedProx, FedAdam, FedYogi)
"""Flower strategies (these classes exactly) whose aggregate is FedAvg's in-place weighted
mean, which ``ReportingStrategy`` can add up from updates read one at a time."""


def weighted_train_metrics(results: Sequence[tuple[ClientProxy, FitRes]]) -> dict[str, float]:
    """Average the sites' numeric training metrics, weighted by their example counts (not
    ``PROCESSES_METRIC``: how many processes a site trained in is its own row's figure)."""
    total = sum(res.num_examples for _, res in results)
    if total == 0:
        return {}
    reported = [
        ({k: float(v) for k, v in bounded_site_metrics(res.metrics).items()
          if isinstance(v, (int, float))}, res.num_examples)
        for _, res in results
    ]  # fmt: skip
    keys = {key for metrics, _ in reported for key in metrics}
    keys.discard("num_examples")
    keys.discard(PROCESSES_METRIC)
    return {
        key: sum(metrics.get(key, 0.0) * n for metrics, n in reported) / total
        for key in sorted(keys)
    }


def arrival_independent_order(
    results: list[tuple[ClientProxy, FitRes]], spooled: SpooledUpdates | None = None
) -> list[tuple[ClientProxy, FitRes]]:
    """The results sorted by the name each site gave, or, when names are missing or repeat,
    by a digest of their weights (an update held on disk, ``spooled``, read for it): not by
    which site answered first.

    Floating-point sums depend on their order, and a seeded run only repeats when the
    strategy adds the same updates in the same order every time. The names spare hashing
    every update (0.1 s a site for a 68 MB model).
    """
    names = [res.metrics.get(SITE_NAME_METRIC) for _proxy, res in results]
    if all(isinstance(name, str) for name in names) and len(set(names)) == len(names):
        return [item for _name, item in sorted(zip(names, results), key=lambda p: p[0])]

    def digest(item: tuple[ClientProxy, FitRes]) -> bytes:
        hasher = hashlib.blake2b(digest_size=16)
        parameters = item[1].parameters
        held = spooled is not None and SpooledUpdates.is_placeholder(parameters)
        for tensor in spooled.tensor_bytes(parameters) if held else parameters.tensors:
            hasher.update(tensor)
        return hasher.digest()

    return sorted(results, key=digest)


def _weighed_equally(
    results: list[tuple[ClientProxy, FitRes]],
) -> list[tuple[ClientProxy, FitRes]]:
    """``results`` with a count of 1 each, so a mean weighs them alike."""
    return [
        (proxy, FitRes(res.status, res.parameters, 1, res.metrics)) for proxy, res in results
    ]


def _serialised(arrays: Iterator[np.ndarray]) -> Parameters:
    """Flower's ``ndarrays_to_parameters`` of arrays read one at a time."""
    return Parameters([ndarray_to_bytes(array) for array in arrays], "numpy.ndarray")


def _unreadable(proxy: ClientProxy, why: object) -> RuntimeError:
    """The error a round's aggregation ends with when a checked update cannot be read again."""
    return RuntimeError(f"held update of site {proxy.node_id} unreadable: {why}")


def _site_ok(proxy: ClientProxy, res: FitRes) -> SiteResult:
    seconds = res.metrics.get("seconds")
    return SiteResult(
        site_id=str(proxy.node_id),
        num_examples=int(res.num_examples),
        metrics=bounded_site_metrics(res.metrics),
        seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
    )


class ReportingStrategy(Strategy):
    """Validation and reporting around a Flower strategy, which keeps sampling and aggregating.

    Every method of ``Strategy`` is implemented: ``configure_fit`` and ``aggregate_fit`` add
    the checks and the per-site records around the wrapped strategy's own; ``evaluate`` scores
    the new global model with ``evaluator`` (not the wrapped strategy's); ``configure_evaluate``
    lets the wrapped strategy sample the sites that evaluate it, in evaluation rounds;
    ``aggregate_evaluate`` records each site's evaluation and their example-weighted mean and
    tells the listeners about the finished round (``federated_evaluation.py`` calls it every
    round, evaluated or not).

    Parameters
    ----------
    strategy : Strategy
        The Flower strategy that samples the sites, aggregates the accepted updates and runs
        federated evaluation (FedAvg, FedProx, FedAdam, Krum, ...).
    evaluator : CentralEvaluator | None
        Scores weights on the coordinator's held-out set and returns ``{"loss": ..., and any
        metric the task computes}``; ``None``: the coordinator holds no data, and rounds are
        scored by federated evaluation only.
    listeners : Sequence[RoundListener] (default: ())
        Told about every completed round (history, progress, report), in order.
    round_starts : Sequence[RoundStartListener] (default: ())
        Told when each round starts, before its sites are sampled (the history's round in
        flight, which a live view counts down).
    round_offset : int (default: 0)
        Added to Flower's round number, so a resumed run keeps counting.
    secure_agg : bool (default: False)
        Whether fit results carry SecAgg+'s unmasked aggregate instead of per-site updates;
        only the aggregate can be checked here then (sites check their own update first).
    max_update_norm : float | None (default: None)
        Reject updates farther than this (L2) from the global model; ``None``: no bound.
    deadline : RoundDeadline | None (default: None)
        The round deadline, named in the reason of every site recorded ``late``.
    min_replies : int (default: 1)
        Fewest accepted replies a round aggregates; with fewer, the round is recorded as
        failed, the global model is kept and the run goes on.
    evaluate_every : int (default: 0)
        Sites evaluate the global model every this many rounds and after ``last_round``
        (Flower's numbering); 0: never.
    last_round : int (default: 0)
        The last round this process runs (Flower's numbering).
    site_replies : SiteReplies | None (default: None)
        What each site said in error replies, noted by node by the run's ``OutcomeGrid``;
        ``None``: none noted, so a sampled site without a result is ``late``.
    cross_site : bool (default: False)
        After ``last_round``'s training, every connected site scores the final global model
        and, under plain aggregation, each site's own last model (under SecAgg+ the
        coordinator never holds one); the matrix goes with the round's summary.
    compression : Compression | None (default: None)
        The run's ``--compress``: each site sends its update in this format, which is decoded
        against the round's global model before any check; an update in another format is
        recorded ``rejected`` with what differs. ``None``: sites send their models.
    traffic : Traffic | None (default: None)
        The bytes the run's grid counted (``traffic.py``): each site's result gets its
        uplink bytes and the round its bytes in and out. ``None``: not recorded.
    spooled : SpooledUpdates | None (default: None)
        Where the round's plain updates are held on disk (``spooled_updates.py``; deployed
        with ``--bulk-address``): each is read to be checked, and, when the wrapped strategy
        is one of ``MEAN_STRATEGIES``, read again to be added into FedAvg's weighted mean
        (the same operations in the same order as Flower's), which the wrapped strategy then
        gets as one result carrying every example. So the coordinator holds the running sum
        and one update, whatever the number of sites. Other strategies, and the last round's
        local models for ``cross_site``, get the updates read into memory. ``None``: every
        update arrives in memory.
    privacy_budget : PrivacyLedger | None (default: None)
        The run's ledger under ``--max-epsilon`` (``privacy_ledger.py``): a round it says
        would cross the budget is not started (``BudgetSpent`` ends the run), and an
        aggregate whose mean would is not released (the round fails, the model is kept).
    equal_weights : bool (default: False)
        Every accepted update weighs the same in the mean, whatever its count (central DP's
        noise is sized for that: ``privacy.py``); the counts are still recorded. Under SecAgg+
        the sites weigh their own vectors (``ServerSettings.training_secagg``).
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        evaluator: CentralEvaluator | None,
        listeners: Sequence[RoundListener] = (),
        round_starts: Sequence[RoundStartListener] = (),
        round_offset: int = 0,
        secure_agg: bool = False,
        max_update_norm: float | None = None,
        deadline: RoundDeadline | None = None,
        min_replies: int = 1,
        evaluate_every: int = 0,
        last_round: int = 0,
        cross_site: bool = False,
        site_replies: SiteReplies | None = None,
        compression: Compression | None = None,
        traffic: Traffic | None = None,
        equal_weights: bool = False,
        privacy_budget: Any = None,
        spooled: SpooledUpdates | None = None,
    ) -> None:
        super().__init__()
        self.spooled = spooled
        self.equal_weights = equal_weights
        self.privacy_budget = privacy_budget
        self.compression = compression if compression is not None and compression.active else None
        self.traffic = traffic
        self.site_replies = site_replies if site_replies is not None else SiteReplies()
        self._replies_mark = 0
        self.strategy = strategy
        self.evaluator = evaluator
        self.listeners = list(listeners)
        self.round_starts = list(round_starts)
        self.round_offset = round_offset
        self.secure_agg = secure_agg
        self.max_update_norm = max_update_norm
        self.deadline = deadline
        self.min_replies = min_replies
        self.evaluate_every = evaluate_every
        self.last_round = last_round
        self.cross_site = cross_site
        self._local_models: dict[int, Parameters] = {}
        self._expected_cross: list[tuple[str, str]] = []
        self._scoring_cross_site = False
        self._pending: RoundSummary | None = None
        self._round_clock = 0.0
        self._asked_to_evaluate: list[int] = []
        self._failed: str | None = None
        self._round_started: tuple[float, datetime] | None = None
        self._global: list[np.ndarray] = []
        self._sampled: list[int] = []
        self._sites: list[SiteResult] = []
        self._warnings: list[str] = []
        self._train_metrics: dict[str, Any] = {}
        self._aggregated = False
        self.in_mean = 0
        """Updates the last ``aggregate_fit`` averaged (central DP's fixed denominator)."""

    def __repr__(self) -> str:
        """Compute a string representation of the strategy."""
        return f"ReportingStrategy({self.strategy!r})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Initialize the global model parameters using the wrapped strategy."""
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Start the round's clock and records, then let the wrapped strategy sample sites
        (unless the privacy budget ends the run here: ``BudgetSpent``)."""
        if self.privacy_budget is not None:
            spent = self.privacy_budget.next_round_problem(server_round + self.round_offset)
            if spent is not None:
                raise BudgetSpent(spent)
        self._round_started = (time.perf_counter(), datetime.now(timezone.utc))
        self._global = parameter_views(parameters)
        self._sites, self._warnings, self._train_metrics = [], [], {}
        self._aggregated, self._failed, self._pending = False, None, None
        self._asked_to_evaluate = []
        self._replies_mark = self.site_replies.mark()  # what sites say in this round's fit
        # noted before sampling: sampling itself waits while too few sites are connected, and
        # a live view should see that round as under way (and overdue), not as nothing
        connected = client_manager.num_available()
        sizing = getattr(self.strategy, "num_fit_clients", None)
        started = RoundInFlight(
            round=server_round + self.round_offset,
            started_at=self._round_started[1],
            deadline_seconds=self.deadline.seconds if self.deadline is not None else None,
            sampled=sizing(connected)[0] if callable(sizing) else connected,
            connected=connected,
        )
        for listener in self.round_starts:
            listener.on_round_start(started)
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        self._sampled = [proxy.node_id for proxy, _ in instructions]
        return instructions

    def _note_clipping(self, proxy: ClientProxy, res: FitRes) -> None:
        fraction = res.metrics.get(CLIPPED_FRACTION_METRIC)
        if isinstance(fraction, float) and fraction > 0:
            self._warnings.append(
                f"site {proxy.node_id}: {100 * fraction:.4f}% of weights clipped by SecAgg+"
            )

    def _check_secure_aggregate(
        self, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        """SecAgg+ hands every result the same unmasked weighted mean: check it once and
        pass it on as one result carrying all the examples (the mean of one is itself)."""
        for proxy, res in results:
            self._sites.append(_site_ok(proxy, res))
            self._note_clipping(proxy, res)
        if not results:
            return []
        mean = results[0][1].parameters
        views = parameter_views(mean)  # in the model's layout already: secagg_sum
        aggregate = unflatten(views, self._global)
        if len(aggregate) == len(self._global):  # Flower's layout: float64
            aggregate = [
                a.astype(g.dtype, copy=False) if a.shape == g.shape else a
                for a, g in zip(aggregate, self._global)
            ]
        problem = update_problem(aggregate, self._global)
        if problem is not None:
            self._warnings.append(f"SecAgg+ aggregate rejected, global model kept: {problem}")
            log.warning("SecAgg+ aggregate rejected, global model kept: %s", problem)
            return []
        unchanged = len(aggregate) == len(views) and all(
            a is v for a, v in zip(aggregate, views)
        )
        first_proxy, first = results[0]
        combined = FitRes(
            status=first.status,
            parameters=mean if unchanged else ndarrays_to_parameters(aggregate),
            num_examples=sum(res.num_examples for _, res in results),
            metrics={},
        )
        return [(first_proxy, combined)]

    def _check_each_update(
        self, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        accepted = []
        for proxy, res in results:
            res, arrays, problem = self._update_of(proxy, res)
            if problem is None:
                problem = update_problem(arrays, self._global, self.max_update_norm)
            del arrays  # a held update is read again to be added up: one at a time
            if problem is None:
                accepted.append((proxy, res))
                self._sites.append(_site_ok(proxy, res))
            else:
                log.warning("update of site %s rejected: %s", proxy.node_id, problem)
                self._sites.append(
                    SiteResult(
                        str(proxy.node_id), "rejected", int(res.num_examples), reason=problem
                    )
                )
        return accepted

    def _update_of(
        self, proxy: ClientProxy, res: FitRes
    ) -> tuple[FitRes, list[np.ndarray] | None, str | None]:
        """``res`` (with the site's model in place of its compressed update, unless it is held
        on disk), the site's model as arrays, or why it is not one in the run's format."""
        if self.spooled is not None and SpooledUpdates.is_placeholder(res.parameters):
            try:
                arrays = self.spooled.arrays(res.parameters, proxy.node_id)
            except SpooledError as exc:
                return res, None, str(exc)
            arrays, problem = self._decoded(arrays, res.metrics)
            return res, arrays, problem
        try:
            arrays = parameters_to_ndarrays(res.parameters)
        except (ValueError, TypeError, EOFError, OSError) as exc:
            return res, None, f"its update is not arrays ({type(exc).__name__})"
        arrays, problem = self._decoded(arrays, res.metrics)
        if problem is None and self.compression is not None:
            res = FitRes(
                status=res.status, parameters=ndarrays_to_parameters(arrays),
                num_examples=res.num_examples, metrics=res.metrics,
            )  # fmt: skip
        return res, arrays, problem

    def _decoded(
        self, arrays: list[np.ndarray], metrics: dict[str, Scalar]
    ) -> tuple[list[np.ndarray] | None, str | None]:
        """The site's model from its ``arrays`` in the run's compression (``compression``), or
        why the update is not in the run's agreed format."""
        if self.compression is None:
            return arrays, None
        agreed = self.compression.spec
        said = metrics.get(COMPRESSION_METRIC)
        if said != agreed:
            return None, (
                f"update sent {f'compressed as {said}' if said else 'uncompressed'}, but the "
                f"run agreed --compress {agreed}"
            )
        try:
            return self.compression.decode(arrays, self._global), None
        except CompressionMismatch as exc:
            return None, f"update not in the run's --compress {agreed} format: {exc}"

    def _held_arrays(self, proxy: ClientProxy, res: FitRes) -> Iterator[np.ndarray]:
        """A checked held update read again (it passed ``_check_each_update``: its file is the
        coordinator's own), one array at a time unless it must be decoded whole."""
        if self.compression is None and self.spooled is not None:
            try:
                yield from self.spooled.arrays_one_by_one(res.parameters, proxy.node_id)
                return
            except SpooledError as exc:
                raise _unreadable(proxy, exc) from None
        yield from self._read_whole(proxy, res)

    def _read_whole(self, proxy: ClientProxy, res: FitRes) -> list[np.ndarray]:
        """A checked update decoded whole (compressed, or not held in the spool)."""
        _res, arrays, problem = self._update_of(proxy, res)
        if arrays is None:
            raise _unreadable(proxy, problem)
        return arrays

    def _in_memory(
        self, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        """``results`` with every held update read into its result."""
        return [
            (proxy, replace(res, parameters=_serialised(self._held_arrays(proxy, res))))
            if self.spooled is not None and SpooledUpdates.is_placeholder(res.parameters)
            else (proxy, res)
            for proxy, res in results
        ]

    def _streamed_mean(
        self, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        """FedAvg's in-place weighted mean of ``results`` (Flower's ``aggregate_inplace``: the
        same operations in the same order), a part of every held update at a time, written
        straight into its serialised bytes (``streamed_mean``), as one result carrying all the
        examples (FedAvg's mean of one is itself)."""
        total = sum(res.num_examples for _, res in results)
        factors = np.asarray([res.num_examples / total for _, res in results])
        sources = [self._held_source(proxy, res) for proxy, res in results]
        try:
            tensors = mean_tensors(sources, factors, sources[0].layers)
        except (ValueError, OSError) as exc:  # checked files of its own: not a site's doing
            raise RuntimeError(f"held updates could not be added up: {exc}") from None
        finally:
            for source in sources:
                source.close()
        log.debug("added up %s updates held on disk, a part at a time", len(results))
        first_proxy, first = results[0]
        combined = FitRes(
            status=first.status, parameters=Parameters(tensors, "numpy.ndarray"),
            num_examples=total, metrics={},
        )  # fmt: skip
        return [(first_proxy, combined)]

    def _held_source(self, proxy: ClientProxy, res: FitRes) -> UpdateSource:
        """A checked update to add up: its file in the spool, read a part at a time, or the
        update decoded whole (compressed, or not held)."""
        if self.compression is None and self.spooled is not None:
            try:
                return HeldUpdate(*self.spooled.places(res.parameters, proxy.node_id))
            except (SpooledError, OSError) as exc:
                raise _unreadable(proxy, exc) from None
        return UpdateInMemory(self._read_whole(proxy, res))

    def _record_failures(self, server_round: int, failures: list) -> None:
        """Record each sampled site that did not reply with an update: what it said, bound to
        its node (``SiteReplies``), or ``late`` when it said nothing by the deadline."""
        known = {int(site.site_id) for site in self._sites}
        for failure in failures:
            if not isinstance(failure, BaseException):  # a result whose status is not OK
                proxy, res = failure
                known.add(proxy.node_id)
                reason = one_line(res.status.message) or "no reason given"
                self._sites.append(SiteResult(str(proxy.node_id), "failed", reason=reason))
        # an error reply reaches the strategy without its node; the grid noted it by node
        late = (
            f"no reply within the round deadline ({self.deadline.seconds:g} s)"
            if self.deadline is not None
            else "no reply"
        )
        for node in self._sampled:
            if node in known:
                continue
            said = self.site_replies.said(server_round, node, since=self._replies_mark)
            self._sites.append(
                SiteResult(str(node), said.status, metrics=said.metrics(), reason=said.reason)
                if said is not None
                else SiteResult(str(node), "late", reason=late)
            )

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Check the updates (or SecAgg+'s aggregate), record every sampled site, and pass
        the accepted results, in an arrival-independent order, to the wrapped strategy."""
        self._sites, self._warnings = [], []
        self._aggregated = True
        self.in_mean = 0
        if self.secure_agg:  # metrics are not masked: all sites that replied count
            self._train_metrics = weighted_train_metrics(results)
            accepted = self._check_secure_aggregate(results)
            self.in_mean = len(results) if accepted else 0
        else:
            checked = self._check_each_update(results)
            accepted, notes = (
                (_weighed_equally(checked), []) if self.equal_weights else bounded_results(checked)
            )
            for note in notes:  # no site weighs in by its word alone (site_weights.py)
                log.warning("round %s: %s", server_round + self.round_offset, note)
            self._warnings.extend(notes)
            self._train_metrics = weighted_train_metrics(accepted)
            self.in_mean = len(accepted)
            if self.cross_site and server_round == self.last_round:
                self._local_models = {
                    proxy.node_id: res.parameters for proxy, res in self._in_memory(accepted)
                }
        self._record_failures(server_round, failures)
        replied = sum(1 for site in self._sites if site.status == "ok")
        if replied < self.min_replies:
            self._failed = (
                f"{replied} of {len(self._sampled)} sampled sites replied, fewer than "
                f"--min-replies {self.min_replies}; the global model was kept"
            )
            log.warning("round %s failed: %s", server_round + self.round_offset, self._failed)
            return None, {}
        if not accepted:
            return None, {}
        held_back = (
            self.privacy_budget.release_problem(server_round + self.round_offset, replied)
            if self.privacy_budget is not None
            else None
        )
        if held_back is not None:
            self._failed = held_back
            log.warning("round %s: %s", server_round + self.round_offset, held_back)
            return None, {}
        ordered = arrival_independent_order(accepted, self.spooled)
        inner = self.strategy
        made_here = self.secure_agg  # the mean of the sites' updates, not one site's bytes
        if any(SpooledUpdates.is_placeholder(res.parameters) for _, res in ordered):
            if not (type(inner) in MEAN_STRATEGIES and inner.inplace):
                return inner.aggregate_fit(server_round, self._in_memory(ordered), failures)
            ordered, made_here = self._streamed_mean(ordered), True
        if (
            made_here
            and len(ordered) == 1
            and ordered[0][1].num_examples > 0
            and type(inner) in (FedAvg, FedProx)
            and inner.inplace
            and inner.fit_metrics_aggregation_fn is None
        ):  # FedAvg's mean of one result (SecAgg+'s, or the streamed mean) is that result:
            # spare the copies it would make (each value times 1.0)
            if failures and not inner.accept_failures:
                return None, {}
            return ordered[0][1].parameters, {}
        return inner.aggregate_fit(server_round, ordered, failures)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """In an evaluation round (``evaluate_every``), let the wrapped strategy sample the
        sites that score the new global model (``fraction_evaluate``) among those connected
        now, never waiting for more (``site_wait.ConnectedNow``), less those recorded late in
        this round's training; none otherwise."""
        cross_site = self.cross_site and server_round == self.last_round
        if self._pending is None or not (
            cross_site or is_evaluation_round(server_round, self.evaluate_every, self.last_round)
        ):
            return []
        instructions = self.strategy.configure_evaluate(
            server_round, parameters, ConnectedNow(client_manager)
        )
        if cross_site and instructions:  # the final model at every connected site
            ins = instructions[0][1]
            instructions = [(proxy, ins) for proxy in client_manager.all().values()]
        # a site still training at this round's deadline would most likely miss the
        # evaluation's too, and hold the round open a second deadline: it is not asked
        late = {site.site_id for site in self._sites if site.status in ("late", "lost")}
        instructions = [(proxy, ins) for proxy, ins in instructions
                        if str(proxy.node_id) not in late]  # fmt: skip
        self._asked_to_evaluate = [proxy.node_id for proxy, _ in instructions]
        self._expected_cross = []
        self._scoring_cross_site = bool(cross_site and instructions)
        if self._scoring_cross_site:
            instructions = instructions + self._cross_site_instructions(instructions)
        return instructions

    def _cross_site_instructions(
        self, asked: list[tuple[ClientProxy, EvaluateIns]]
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Each site's own last model, to every site asked to score the global one."""
        config = dict(asked[0][1].config)
        extra = []
        for owner, model in sorted(self._local_models.items()):
            ins = EvaluateIns(model, {**config, CROSS_SITE_MODEL_KEY: str(owner)})
            for proxy, _ in asked:
                extra.append((proxy, ins))
                self._expected_cross.append((str(owner), str(proxy.node_id)))
        self._local_models = {}
        return extra

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Record each asked site's evaluation (ok, failed with its reason, or late) and the
        example-weighted mean of every metric, then tell the listeners the round is done."""
        summary = self._pending
        if summary is None:
            return None, {}
        failures = [
            f if not isinstance(f, BaseException)  # not sent by our workflow; kept anyway
            else failed_outcome(UnknownSite(), failure_said(f).reason, failure_said(f).status)
            for f in failures
        ]  # fmt: skip
        late = (
            f"no evaluation within the round deadline ({self.deadline.seconds:g} s)"
            if self.deadline is not None
            else "no evaluation"
        )
        evaluations, cross_site = site_evaluations(
            results, failures, self._asked_to_evaluate, self._expected_cross, late
        )
        self._expected_cross = []
        summary.evaluations = evaluations
        summary.federated = weighted_evaluation(
            [(p, r) for p, r in results if CROSS_SITE_MODEL_KEY not in r.metrics]
        )
        if self._scoring_cross_site:
            self._scoring_cross_site = False
            summary.cross_site = cross_site
        self._finish(summary)
        loss = summary.federated.get("loss")
        return loss, {k: v for k, v in summary.federated.items() if k != "loss"}

    def record_private_evaluation(
        self,
        server_round: int,
        federated: dict[str, float] | None,
        sites: list[SiteResult],
        problem: str | None,
    ) -> None:
        """Finish the round with a private evaluation's outcome (``private_evaluation.py``):
        the unmasked example-weighted mean (``None`` when there is none), the sites asked with
        their status and example counts but no figures of their own, and why it failed or
        was skipped (a warning of the round)."""
        summary = self._pending
        if summary is None:
            return
        summary.evaluations = sites
        summary.federated = dict(federated or {})
        if problem:
            summary.warnings = [*summary.warnings, problem]
        self._finish(summary)

    def _finish(self, summary: RoundSummary) -> None:
        """Close the round: its headline figures are the federated ones when the
        coordinator holds no data; tell the listeners."""
        if not summary.central and summary.federated:
            summary.loss = summary.federated.get("loss")
            summary.accuracy = summary.federated.get("accuracy")
        if self.traffic is not None:
            self._note_traffic(summary)
        summary.seconds = time.perf_counter() - self._round_clock
        summary.ended_at = datetime.now(timezone.utc)
        for listener in self.listeners:
            listener.on_round(summary)
        self._pending = None
        self._round_started = None

    def _note_traffic(self, summary: RoundSummary) -> None:
        """The round's bytes in and out, and each training site's uplink bytes, as the grid
        counted them (the round's Flower number is the summary's less the offset)."""
        counted = self.traffic.of_round(summary.round - self.round_offset)
        summary.bytes_in = sum(site.train_in + site.other_in for site in counted.values())
        summary.bytes_out = sum(site.train_out + site.other_out for site in counted.values())
        for result in summary.sites:
            site = counted.get(int(result.site_id)) if result.site_id.isdigit() else None
            if site is not None and site.train_in:
                result.metrics = {**result.metrics, UPLINK_BYTES_METRIC: site.train_in}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Score the new global model with ``evaluator`` (when the coordinator holds test
        data) and keep the round's summary for ``aggregate_evaluate``, which finishes it after
        the sites evaluated; ``None`` at round 0 (the initial model is not evaluated)."""
        if server_round == 0 or self._round_started is None:
            return None  # the initial model is a checkpoint or a fresh init: not worth a pass
        if not self._aggregated:
            # SecAgg+ halted the round before aggregation (too few sites stayed): the global
            # model is unchanged and every sampled site counts as failed for this round.
            reason = "round halted before aggregation: too few sites completed SecAgg+"
            self._sites = [SiteResult(str(node), "failed", reason=reason) for node in self._sampled]
            self._warnings.append(reason)
            self._failed = self._failed or reason
        weights = parameter_views(parameters)
        central = (
            {k: float(v) for k, v in self.evaluator(weights).items()}
            if self.evaluator is not None
            else {}
        )
        started, started_at = self._round_started
        self._round_clock = started
        self._pending = RoundSummary(
            round=server_round + self.round_offset,
            loss=central.get("loss"),
            accuracy=central.get("accuracy"),  # none for regression
            seconds=time.perf_counter() - started,
            started_at=started_at,
            ended_at=datetime.now(timezone.utc),
            weights=weights,
            sites=self._sites,
            train_metrics=self._train_metrics,
            warnings=self._warnings,
            failed=self._failed,
            central=central,
            deadline_seconds=self.deadline.seconds if self.deadline is not None else None,
        )
        if not central:
            return None
        return central["loss"], {k: v for k, v in central.items() if k != "loss"}
