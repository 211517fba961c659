"""Buffered asynchronous aggregation (FedBuff: Nguyen et al., AISTATS 2022), simulated.

Every site trains all the time, each job on the newest global model there is when it starts;
the coordinator moves the model every ``--buffer`` (K) arrivals. An update trained on model
step ``v`` that arrives at step ``v'`` is ``v' - v`` steps stale; it is weighted down by
``staleness_weight`` (the paper's ``1 / sqrt(1 + staleness)``) and discarded beyond
``--max-staleness``. A step applies, with the buffer's examples as FedAvg weights ``p``::

    w <- w + server_lr * sum_j p_j * staleness_weight(staleness_j) * (w_j - w_at_its_start_j)

so a buffer of fresh updates is a FedAvg step (``--server-lr`` 1, the default), and stale
ones move the model less. Each
applied buffer is a round of the history: its members with their staleness (site metric
``staleness``), the discarded ones recorded ``late`` with the reason, the central evaluation
of the new model, and the simulated clock.

Time is the simulated clock of ``fedweave.learning.site_speeds``: a site's job takes its
simulated seconds, so arrivals are ordered by when they would happen at sites of unequal
speed, not by when this machine happened to compute them. The coordinator learns each site's
name and examples from its first reply (every site's first job starts at time 0 together);
from then on it knows when each job it sends will finish, sends jobs as soon as a site is
free, and waits on this machine only for the replies of the arrivals it applies. Deployed
asynchronous rounds (real time, real links) and asynchrony under SecAgg+ are not built.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.app.message_type import MessageType
from flwr.common import Code, Context, FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from flwr.server import Grid, ServerApp

from fedweave.contract import SIMULATED_SECONDS_METRIC, SITE_NAME_METRIC, bounded_site_metrics
from fedweave.coordinator.rounds import RoundSummary
from fedweave.errors import UserError
from fedweave.history.records import RoundInFlight, SiteResult

log = logging.getLogger("fedweave.coordinator")

REPLY_WAIT_SECONDS = 600.0
"""Wall-clock seconds the coordinator waits for one job's reply before it drops that site
(a simulated site that never answers: its worker died)."""
POLL_SECONDS = 0.05


def staleness_weight(staleness: int) -> float:
    """How much an update ``staleness`` model steps old counts: ``1 / sqrt(1 + staleness)``."""
    return 1.0 / float(np.sqrt(1.0 + max(0, staleness)))


@dataclass(order=True)
class _Job:
    """One site's local training on one model step, finishing at ``finishes_at``."""

    finishes_at: float
    node: int
    version: int = field(compare=False)
    message_id: str = field(compare=False)
    started_at: float = field(compare=False)


@dataclass
class _Site:
    name: str
    examples: int


class _Arrivals:
    """Replies by message id, pulled from the grid as they come (wall clock)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.replies: dict[str, Message] = {}

    def wait(self, message_ids: list[str], timeout: float) -> dict[str, Message]:
        """The replies to ``message_ids`` that arrive by ``timeout`` seconds from now."""
        deadline = time.monotonic() + timeout
        missing = [m for m in message_ids if m not in self.replies]
        while missing and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(missing):
                self.replies[reply.metadata.reply_to_message_id] = reply
            missing = [m for m in message_ids if m not in self.replies]
            if missing:
                time.sleep(POLL_SECONDS)
        return {m: self.replies.pop(m) for m in message_ids if m in self.replies}


def _fit_result(reply: Message) -> tuple[Any, str | None]:
    """(FitRes, None) of a good reply, or (None, why not)."""
    if reply.has_error():
        return None, f"error reply (code {reply.error.code}): {reply.error.reason}"
    try:
        res = compat.recorddict_to_fitres(reply.content, keep_input=False)
    except Exception as exc:  # noqa: BLE001 - a site's malformed reply is its failure
        return None, f"malformed reply: {type(exc).__name__}"
    if res.status.code != Code.OK:
        return None, res.status.message or "the site did not train"
    return res, None


def make_fedbuff_server_app(
    settings,
    test_data: Any,
    start_weights: list[np.ndarray],
    listeners,
    round_starts=(),
    clock_start: float = 0.0,
) -> ServerApp:
    """A ServerApp that applies ``settings.rounds`` buffers of ``settings.buffer`` updates
    from ``start_weights`` (``--schedule async``); every buffer is told to ``listeners`` as a
    round (``RoundSummary``), and ``round_starts`` hear when each model step begins."""
    from fedweave.coordinator.model_health import ModelHealth
    from fedweave.coordinator.server_app import make_central_evaluator
    from fedweave.learning.site_speeds import SiteSpeeds
    from fedweave.learning.statistics import needs_statistics
    from fedweave.learning.task import load_task

    config = settings.config
    task = load_task(config.data.task)
    if test_data is None:
        raise UserError(
            "--schedule async scores each model step centrally: give --test-data (or a task "
            "with its own test split)"
        )
    if needs_statistics(task):
        raise UserError(
            f"task '{config.data.task}' needs federated statistics before round 1, which "
            "--schedule async does not gather yet; use --schedule sync"
        )
    speeds = settings.site_speeds or SiteSpeeds.parse("equal", config.training.seed)
    evaluate = make_central_evaluator(config.data.task, test_data, config.training.device)
    told = [ModelHealth(listeners, int(getattr(task, "num_classes", 0)))]
    buffer_size, max_staleness = settings.buffer, config.federation.max_staleness
    server_lr = config.federation.server_lr or 1.0
    epochs = config.training.local_epochs
    extra_config = (
        {"proximal_mu": config.federation.proximal_mu}
        if config.federation.strategy == "fedprox"
        else {}
    )
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        nodes = _wait_for_nodes(grid, settings.min_clients)
        arrivals = _Arrivals(grid)
        models: dict[int, list[np.ndarray]] = {0: [w.copy() for w in start_weights]}
        model_bytes = sum(int(w.nbytes) for w in start_weights)
        version, clock = 0, clock_start
        sites: dict[int, _Site] = {}
        pending: list[_Job] = []
        waiting: dict[int, str] = {}  # node -> its first job, whose length its reply tells

        def send(node: int, step: int) -> str:
            """Ask ``node`` to train on model step ``step`` (its round label: the step it
            will make, so a site sees them rise)."""
            ins = FitIns(
                ndarrays_to_parameters(models[step]),
                {**settings.fit_config(step + 1, REPLY_WAIT_SECONDS), **extra_config},
            )
            message = Message(
                content=compat.fitins_to_recorddict(ins, True), dst_node_id=node,
                message_type=MessageType.TRAIN,
                group_id=str(step + 1 + settings.round_offset),
            )  # fmt: skip
            (message_id,) = grid.push_messages([message])
            return message_id

        for node in nodes:  # every site's first job starts at the same time
            waiting[node] = send(node, version)
        first = arrivals.wait(list(waiting.values()), REPLY_WAIT_SECONDS)
        results: dict[str, tuple[Any, str | None]] = {}
        for node, message_id in waiting.items():
            reply = first.get(message_id)
            res, why = _fit_result(reply) if reply is not None else (None, "no reply")
            if res is None:
                log.warning("site (node %s) left the asynchronous run: %s", node, why)
                continue
            name = str(res.metrics.get(SITE_NAME_METRIC) or node)
            sites[node] = _Site(name, int(res.num_examples))
            finishes = clock + speeds.job_seconds(name, int(res.num_examples), epochs, model_bytes)
            heapq.heappush(pending, _Job(finishes, node, version, message_id, clock))
            results[message_id] = (res, None)
        if len(sites) < buffer_size:
            raise UserError(
                f"only {len(sites)} sites answered their first job, fewer than --buffer "
                f"{buffer_size}; check the sites' failures above"
            )
        step_began = clock
        for step in range(1, settings.rounds + 1):
            wall_start, started_at = time.perf_counter(), datetime.now(timezone.utc)
            for listener in round_starts:
                listener.on_round_start(RoundInFlight(
                    step + settings.round_offset, started_at, None, buffer_size, len(sites)))
            members: list[tuple[_Job, Any]] = []
            dropped: list[SiteResult] = []
            while len(members) < buffer_size and pending:
                job = heapq.heappop(pending)
                clock = max(clock, job.finishes_at)
                if job.message_id not in results:
                    got = arrivals.wait([job.message_id], REPLY_WAIT_SECONDS)
                    reply = got.get(job.message_id)
                    results[job.message_id] = (
                        _fit_result(reply) if reply is not None else (None, "no reply")
                    )
                res, why = results.pop(job.message_id)
                site = sites[job.node]
                staleness = version - job.version
                if res is None:
                    dropped.append(SiteResult(site.name, "failed", reason=why))
                elif max_staleness is not None and staleness > max_staleness:
                    dropped.append(SiteResult(
                        site.name, "late", int(res.num_examples), {"staleness": staleness},
                        reason=f"stale: trained on model step {job.version}, arrived at step "
                        f"{version}, more than --max-staleness {max_staleness} behind",
                    ))  # fmt: skip
                else:
                    members.append((job, res))
                # the site starts its next job now, on the newest model
                message_id = send(job.node, version)
                finishes = clock + speeds.job_seconds(site.name, site.examples, epochs,
                                                      model_bytes)  # fmt: skip
                heapq.heappush(pending, _Job(finishes, job.node, version, message_id, clock))
            if not members:
                raise UserError("every site of the asynchronous run failed; see their reasons")
            update, train_metrics, member_results = _apply(models, version, members, sites)
            version += 1
            models[version] = [
                w + (server_lr * u).astype(w.dtype) for w, u in zip(models[version - 1], update)
            ]
            referenced = {job.version for job in pending} | {version}
            for old in [v for v in models if v not in referenced]:
                del models[old]
            kept = {site.site_id for site in member_results}
            notes = []
            for site in dropped:  # one row a site a round: a second one becomes a note
                if site.site_id in kept:
                    notes.append(f"site {site.site_id}: another update {site.status}: "
                                 f"{site.reason}")  # fmt: skip
                else:
                    kept.add(site.site_id)
                    member_results.append(site)
            central = {k: float(v) for k, v in evaluate(models[version]).items()}
            summary = RoundSummary(
                round=step + settings.round_offset,
                loss=central.get("loss"),
                accuracy=central.get("accuracy"),
                seconds=time.perf_counter() - wall_start,
                started_at=started_at,
                ended_at=datetime.now(timezone.utc),
                weights=models[version],
                sites=member_results,
                train_metrics=train_metrics,
                warnings=notes,
                central=central,
                simulated_seconds=clock - step_began,
                simulated_clock=clock,
            )
            step_began = clock
            for listener in told:
                listener.on_round(summary)

    return app


def _apply(
    models: dict[int, list[np.ndarray]],
    version: int,
    members: list[tuple[_Job, Any]],
    sites: dict[int, _Site],
) -> tuple[list[np.ndarray], dict[str, float], list[SiteResult]]:
    """The buffer's step (``models[version] + update``), its training metrics weighted by
    examples, and each member site's record (its staleness among its metrics; a site that
    arrived twice: one record, ``updates`` 2, the larger staleness)."""
    total = float(sum(max(int(res.num_examples), 0) for _, res in members)) or 1.0
    update = [np.zeros_like(w) for w in models[version]]
    sums: dict[str, float] = {}
    recorded: dict[str, SiteResult] = {}
    for job, res in members:
        weights = parameters_to_ndarrays(res.parameters)
        share = max(int(res.num_examples), 0) / total
        staleness = version - job.version
        factor = share * staleness_weight(staleness)
        for target, new, old in zip(update, weights, models[job.version]):
            target += (factor * (new.astype(np.float64) - old)).astype(target.dtype)
        metrics = bounded_site_metrics(res.metrics)
        for name, value in metrics.items():
            if name.startswith("train_") and isinstance(value, (int, float)):
                sums[name] = sums.get(name, 0.0) + share * float(value)
        metrics = {k: v for k, v in metrics.items() if k != SITE_NAME_METRIC}
        name = sites[job.node].name
        seconds = metrics.get(SIMULATED_SECONDS_METRIC)
        if name in recorded:  # a fast site can arrive twice in one buffer: one row, both counted
            earlier = recorded[name]
            earlier.num_examples += int(res.num_examples)
            earlier.metrics["updates"] = int(earlier.metrics.get("updates", 1)) + 1
            earlier.metrics["staleness"] = max(int(earlier.metrics["staleness"]), staleness)
            continue
        recorded[name] = SiteResult(
            name, "ok", int(res.num_examples),
            {**metrics, "staleness": staleness, "node_id": str(job.node)},
            seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
        )  # fmt: skip
    return update, sums, list(recorded.values())


def _wait_for_nodes(grid: Grid, needed: int, timeout: float = 600.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= needed:
            return nodes
        if time.monotonic() > deadline:
            raise UserError(f"only {len(nodes)} of {needed} sites connected")
        time.sleep(0.5)
