"""Buffered asynchronous aggregation (FedBuff: Nguyen et al., AISTATS 2022).

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

Two clocks order the arrivals:

- **Real time** (a deployed coordinator, or a simulation without ``--site-speeds``): updates
  are taken in the order they reach the coordinator. A job unanswered within the round
  deadline (``--round-timeout``) is recorded ``late`` and the site gets a new one, if it is
  still connected; a site that joins mid-run gets its first job at once.
- **The simulated clock** of ``fedweave.learning.site_speeds`` (``--site-speeds``): a site's
  job takes its simulated seconds, so arrivals are ordered by when they would happen at sites
  of unequal speed, not by when this machine happened to compute them. The coordinator learns
  each site's name and examples from its first reply (every site's first job starts at time 0
  together); from then on it knows when each job it sends will finish, sends jobs as soon as
  a site is free, and waits on this machine only for the replies of the arrivals it applies.

One site fills at most one slot of a buffer: an update from a site already in the buffer
being filled waits for the next one (its site gets its next job when it is taken), so a fast
site, or one that answers at once with anything, cannot make a buffer its own. FedBuff's
analysis (a buffer's mean over its ``K`` updates, staleness bounded) holds unchanged; the
buffer is then a mean over ``K`` sites, as the SecAgg+ buffers below always were, and a fast
site's update is at most one step staler for waiting. Every arrival passes the update check
of the synchronous rounds (``learning.validation.update_problem``: the model's shapes and
dtypes, finite values, ``--max-update-norm``) or is recorded ``rejected``; a buffer's weights
are bounded like a round's (``site_weights``: at most twice the median of the sites' latest
counts); and a step whose new model is not finite is not taken.

Under ``--compress`` a site's update is decoded against the model step it trained on; one in
another format is recorded ``rejected`` with what differs. Each step records the bytes its
arrivals carried in and the models it sent out.

Under SecAgg+ the coordinator never sees one update (``coordinator/rounds/secure_buffer.py``): a
job only trains, and its site holds the update (``client/held_updates.py``) and gets no new
job meanwhile; the first ``--buffer`` sites holding one form the buffer's SecAgg+ cohort,
and the unmasked sum is the step above. A site dropped from that round is recorded with
why; then every site of the buffer starts its next job on the new model.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
from flwr.app import Message, MessageType
from flwr.common import Code, Context, FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import Grid, ServerApp

from fedweave.contract import (
    COMPRESSION_METRIC,
    HELD_METRIC,
    HOLD_KEY,
    JOB_KEY,
    SIMULATED_SECONDS_METRIC,
    SITE_NAME_METRIC,
    UPLINK_BYTES_METRIC,
    bounded_site_metrics,
    outcome_of,
    read_outcome,
)
from fedweave.coordinator.rounds.downlink import HalfPrecisionGrid
from fedweave.coordinator.rounds.secure_agg import make_secagg_workflow
from fedweave.coordinator.rounds.secure_buffer import BufferSum, secure_buffer_sum
from fedweave.coordinator.rounds.site_weights import (
    MAX_TIMES_MEDIAN,
    MIN_SITES_TO_BOUND,
    bounded_note,
    count_bound,
)
from fedweave.coordinator.rounds.traffic import Traffic, payload_bytes
from fedweave.downlink import halved
from fedweave.errors import UserError
from fedweave.flower_patches import message_records as compat
from fedweave.flower_patches.object_pulls import pulls_end_by, unavailable
from fedweave.flower_patches.secagg_masks import unflatten
from fedweave.history.records import RoundInFlight, SiteResult
from fedweave.history.round_summary import RoundSummary
from fedweave.learning.compression import Compression, CompressionMismatch
from fedweave.learning.validation import count_problem, update_problem

log = logging.getLogger("fedweave.coordinator")

REPLY_WAIT_SECONDS = 600.0
"""Wall-clock seconds the coordinator waits for one job's reply before it drops that site
(a simulated site that never answers: its worker died)."""
POLL_SECONDS = 0.05
NODE_CHECK_SECONDS = 1.0
"""Real time: how often the coordinator looks for sites that connected mid-run."""


PULL_TIMES_MEDIAN = 1.0
"""A site's change (L2) counts at most this many times the median of the sites' latest
changes: adaptive clipping at the median (Andrew et al., NeurIPS 2021, target quantile 0.5).
A buffer may hold two updates, so a bound above 1 leaves one site sending zeros most of every
step it is in: ``bench/bench_fedbuff_insiders.py --insiders`` (5 digits sites, ``--buffer 2``,
30 steps, 3 seeds) ended at 0.17-0.47 with 2 and at 0.75-0.79 with 1; the honest runs' last
five steps averaged 0.853 with 2 and 0.831 with 1 (0.860 before any bound)."""


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
    number: int = field(compare=False)


@dataclass
class _Site:
    name: str
    examples: int


class _Arrivals:
    """Replies by message id, pulled from the grid as they come (wall clock). A reply whose
    weights do not finish arriving by the caller's deadline is kept as Flower's stand-in for
    it (``object_pulls.unavailable``): its job is late."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.replies: dict[str, Message] = {}

    def first(self, message_ids: list[str], pulls_end: float) -> str | None:
        """The id of a reply among ``message_ids`` already here (pulled now, each given until
        ``pulls_end``, a ``time.monotonic()`` time, to finish arriving), in the order they
        came, or None."""
        missing = [m for m in message_ids if m not in self.replies]
        if missing:
            self._pull(missing, pulls_end)
        return next((m for m in self.replies if m in set(message_ids)), None)

    def wait(self, message_ids: list[str], timeout: float) -> dict[str, Message]:
        """The replies to ``message_ids`` that arrive by ``timeout`` seconds from now."""
        deadline = time.monotonic() + timeout
        missing = [m for m in message_ids if m not in self.replies]
        while missing and time.monotonic() < deadline:
            self._pull(missing, deadline)
            missing = [m for m in message_ids if m not in self.replies]
            if missing:
                time.sleep(POLL_SECONDS)
        return {m: self.replies.pop(m) for m in message_ids if m in self.replies}

    def _pull(self, message_ids: list[str], pulls_end: float) -> None:
        with pulls_end_by(pulls_end):
            for reply in self.grid.pull_messages(message_ids):
                self.replies[reply.metadata.reply_to_message_id] = reply


@dataclass(frozen=True)
class _Outcome:
    """A job's result (``res``), or the status and reason it has none."""

    res: Any = None
    status: str = "failed"
    reason: str | None = None
    change: float | None = None
    """How far its weights are from the step it trained on (L2); plain buffers only."""


def _fit_result(reply: Message | None, silent: str = "no reply") -> _Outcome:
    """What ``reply`` brought: its FitRes, or what the site said (refused, rejected, late,
    failed, bound to it by the reply), or ``silent``'s reason when there is none."""
    if reply is None:
        return _Outcome(status="late", reason=silent)
    if unavailable(reply):
        return _Outcome(status="late", reason="its update did not finish arriving in time")
    if reply.has_error():
        status, reason = outcome_of(int(reply.error.code), reply.error.reason)
        return _Outcome(status=status, reason=reason)
    said = read_outcome(reply.content)
    if said is not None:
        status, reason = outcome_of(said[0], said[1])
        return _Outcome(status=status, reason=reason)
    try:
        res = compat.recorddict_to_fitres(reply.content, keep_input=False)
    except Exception as exc:  # noqa: BLE001 - a site's malformed reply is its failure
        return _Outcome(reason=f"malformed reply: {type(exc).__name__}")
    if res.status.code != Code.OK:
        return _Outcome(reason=res.status.message or "the site did not train")
    problem = count_problem(res.num_examples)
    if problem is not None:
        return _Outcome(status="rejected", reason=problem)
    return _Outcome(res)


def _held(outcome: _Outcome, job: int) -> _Outcome:
    """``outcome`` of a job whose site was to hold its update for a secure buffer, or
    ``rejected`` when the site sent weights instead (they are dropped unread)."""
    res = outcome.res
    if res.parameters.tensors or res.metrics.get(HELD_METRIC) != job:
        return _Outcome(
            status="rejected",
            reason=f"sent its update in the clear instead of holding job {job}'s for a "
            "SecAgg+ buffer (a fedweave too old?)",
        )
    return outcome


def _decoded(outcome: _Outcome, compression: Compression, reference: list[np.ndarray]) -> _Outcome:
    """``outcome`` with the site's model in place of its compressed update (trained on
    ``reference``), or ``rejected`` with what differs from the run's ``--compress``."""
    res = outcome.res
    if res is None or not compression.active:
        return outcome
    said = res.metrics.get(COMPRESSION_METRIC)
    if said != compression.spec:
        sent = f"compressed as {said}" if said else "uncompressed"
        return _Outcome(status="rejected", reason=f"update sent {sent}, but the run agreed "
                        f"--compress {compression.spec}")  # fmt: skip
    try:
        weights = compression.decode(parameters_to_ndarrays(res.parameters), reference)
    except CompressionMismatch as exc:
        return _Outcome(status="rejected", reason=f"update not in the run's --compress "
                        f"{compression.spec} format: {exc}")  # fmt: skip
    res.parameters = ndarrays_to_parameters(weights)
    return outcome


def _checked(
    outcome: _Outcome, reference: list[np.ndarray], max_norm: float | None
) -> _Outcome:
    """``outcome``, or ``rejected`` with why its weights (trained on ``reference``) may not
    enter a buffer: the update check of the synchronous rounds (shapes, dtypes, finite values,
    ``max_norm`` on the change: ``--max-update-norm``)."""
    if outcome.res is None:
        return outcome
    weights = parameters_to_ndarrays(outcome.res.parameters)
    problem = update_problem(weights, reference, max_norm)
    if problem is not None:
        return _Outcome(status="rejected", reason=problem)
    squared = sum(
        float(np.sum((w.astype(np.float64) - r) ** 2)) for w, r in zip(weights, reference)
    )
    return replace(outcome, change=squared**0.5)


def make_fedbuff_server_app(
    settings,
    test_data: Any,
    start_weights: list[np.ndarray],
    listeners,
    round_starts=(),
    clock_start: float = 0.0,
    deadline=None,
    registered_names=None,
    wire=None,
) -> ServerApp:
    """A ServerApp that applies ``settings.rounds`` buffers of ``settings.buffer`` updates
    from ``start_weights`` (``--schedule async``); every buffer is told to ``listeners`` as a
    round (``RoundSummary``), and ``round_starts`` hear when each model step begins.
    ``clock_start``: a resumed run's simulated clock; ``deadline``: the run's
    ``RoundDeadline`` (in arrival order, how long one job may take; default: sized here);
    ``registered_names``: node id → the name its site key is registered under (a site is
    recorded by it, whatever it claims; None: by the name it gives)."""
    from fedweave.coordinator.rounds.central_evaluation import make_central_evaluator
    from fedweave.coordinator.rounds.model_health import ModelHealth
    from fedweave.learning.statistics import needs_statistics
    from fedweave.learning.tasks import load_task

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
    speeds = settings.site_speeds  # None: real time
    from fedweave.learning.adapters import run_task

    evaluate = make_central_evaluator(run_task(config), test_data, config.training.device)
    told = [ModelHealth(listeners, int(getattr(task, "num_classes", 0)))]
    buffer_size, max_staleness = settings.buffer, config.federation.max_staleness
    server_lr = config.federation.server_lr or 1.0
    max_update_norm = config.federation.max_update_norm
    compression = settings.compression
    epochs = config.training.local_epochs
    deadline = deadline or settings.deadline(test_data)
    job_deadline = deadline.seconds
    secure = settings.secure_agg
    extra_config = (
        {"proximal_mu": config.federation.proximal_mu}
        if config.federation.strategy == "fedprox"
        else {}
    )
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if wire is not None:  # deployed with --bulk-address: tensors beside the messages
            grid = wire(grid)
        if settings.downlink == "fp16":
            grid = HalfPrecisionGrid(grid)
        nodes = _wait_for_nodes(grid, settings.min_clients)
        arrivals = _Arrivals(grid)
        models: dict[int, list[np.ndarray]] = {0: [w.copy() for w in start_weights]}
        model_bytes = sum(  # what a job sends down
            int(w.nbytes)
            for w in (halved(start_weights)[0] if settings.downlink == "fp16" else start_weights)
        )
        update_bytes = compression.sent_bytes(start_weights)  # what a site's job sends up
        version, clock = 0, clock_start
        sites: dict[int, _Site] = {}
        pending: list[_Job] = []  # simulated clock: a heap by finishing time
        running: dict[str, _Job] = {}  # real time: jobs out, by message id, in sending order
        results: dict[str, _Outcome] = {}
        traffic = {"in": 0, "out": 0}
        checked = [time.monotonic()]  # real time: when connected sites were last looked up
        jobs: dict[int, int] = {}  # node -> jobs sent to it so far (its jobs' numbers)
        claimed: dict[int, int] = {}  # node -> the count of its latest update in a buffer
        pulls: dict[int, float] = {}  # node -> how far its latest update in a buffer moved
        carried: list[tuple[_Job, _Outcome]] = []  # arrivals from sites already in the buffer
        bounding = 0 if secure else min(MIN_SITES_TO_BOUND, len(nodes))
        answered: set[int] = set()  # sites that answered a job, with an update or without
        workflow = make_secagg_workflow(settings.secagg, buffer_size, deadline) if secure else None

        def send(node: int, step: int) -> str:
            """Ask ``node`` to train on model step ``step`` (its round label: the step it
            will make, so a site sees them rise)."""
            jobs[node] = number = jobs.get(node, 0) + 1
            ins = FitIns(
                ndarrays_to_parameters(models[step]),
                {**settings.fit_config(step + 1, job_deadline), **extra_config,
                 JOB_KEY: number, **({HOLD_KEY: True} if secure else {})},
            )  # fmt: skip
            message = Message(
                content=compat.fitins_to_recorddict(ins, True), dst_node_id=node,
                message_type=MessageType.TRAIN,
                group_id=str(step + 1 + settings.round_offset),
            )  # fmt: skip
            (message_id,) = grid.push_messages([message])
            traffic["out"] += payload_bytes(message.content)  # as sent (--downlink: halved)
            if speeds is None:
                running[message_id] = _Job(time.monotonic(), node, step, message_id, clock,
                                           number)  # fmt: skip
            return message_id

        def received(outcome: _Outcome, job: _Job) -> _Outcome:
            if outcome.res is not None:
                uplink = sum(len(tensor) for tensor in outcome.res.parameters.tensors)
                traffic["in"] += uplink
                outcome.res.metrics[UPLINK_BYTES_METRIC] = uplink
                if secure:
                    return _held(outcome, job.number)
            reference = models[job.version]
            return _checked(_decoded(outcome, compression, reference), reference, max_update_norm)

        def heard(node: int, outcome: _Outcome) -> None:
            """The figures of a site's latest update that the buffers' bounds are taken over."""
            claimed[node] = int(outcome.res.num_examples)
            if outcome.change is not None:
                pulls[node] = outcome.change

        def registered(node: int) -> str | None:
            return registered_names().get(str(node)) if registered_names else None

        def learn(node: int, outcome: _Outcome) -> None:
            """A site's name and examples, from its first result."""
            if node not in sites and outcome.res is not None:
                name = registered(node) or str(outcome.res.metrics.get(SITE_NAME_METRIC) or node)
                sites[node] = _Site(name, int(outcome.res.num_examples))

        def name_of(node: int) -> str:
            """A site's name, also before a first result of it was taken (a site whose every
            arrival is rejected is still recorded under the name its key is registered with)."""
            return sites[node].name if node in sites else registered(node) or str(node)

        if speeds is None:
            for node in nodes:
                send(node, version)
        else:  # every site's first job starts at the same time; its reply tells its length
            waiting = {node: send(node, version) for node in nodes}
            answered.update(nodes)  # each has answered its first job, or left the run
            first = arrivals.wait(list(waiting.values()), REPLY_WAIT_SECONDS)
            for node, message_id in waiting.items():
                job = _Job(clock, node, version, message_id, clock, jobs[node])
                outcome = received(_fit_result(first.get(message_id)), job)
                if outcome.res is None:
                    log.warning("site (node %s) left the asynchronous run: %s", node,
                                outcome.reason)  # fmt: skip
                    continue
                learn(node, outcome)
                heard(node, outcome)  # every site's figures bound the first step already
                site = sites[node]
                job.finishes_at = clock + speeds.job_seconds(
                    site.name, site.examples, epochs, model_bytes, update_bytes
                )
                heapq.heappush(pending, job)
                results[message_id] = outcome
            if len(sites) < buffer_size:
                raise UserError(
                    f"only {len(sites)} sites answered their first job, fewer than --buffer "
                    f"{buffer_size}; check the sites' failures above"
                )

        def next_simulated() -> tuple[_Job, _Outcome]:
            nonlocal clock
            if not pending:
                raise UserError("every site of the asynchronous run failed; see their reasons")
            job = heapq.heappop(pending)
            clock = max(clock, job.finishes_at)
            if job.message_id not in results:
                got = arrivals.wait([job.message_id], REPLY_WAIT_SECONDS)
                results[job.message_id] = received(_fit_result(got.get(job.message_id)), job)
            return job, results.pop(job.message_id)

        def next_real() -> tuple[_Job, _Outcome]:
            """The next update to reach the coordinator, or the oldest job past its
            deadline; a site that connected since gets its first job meanwhile."""
            while True:
                if time.monotonic() - checked[0] >= NODE_CHECK_SECONDS:
                    checked[0] = time.monotonic()
                    known = {job.node for job in running.values()} | set(sites)
                    for node in sorted(set(grid.get_node_ids()) - known):
                        log.info("site (node %s) joined the asynchronous run", node)
                        send(node, version)
                if not running:
                    raise UserError(
                        f"fewer than --buffer {buffer_size} sites are left in the asynchronous "
                        "run (one site fills one slot of a buffer); see their reasons above"
                        if carried
                        else "every site of the asynchronous run left or failed; see their "
                        "reasons"
                    )
                last_deadline = max(job.finishes_at for job in running.values()) + job_deadline
                message_id = arrivals.first(list(running), last_deadline)
                if message_id is not None:
                    job = running.pop(message_id)
                    reply = arrivals.replies.pop(message_id)
                    return job, received(_fit_result(reply), job)
                oldest = next(iter(running.values()))
                if time.monotonic() - oldest.finishes_at > job_deadline:
                    running.pop(oldest.message_id)
                    silent = f"no update within the round deadline ({job_deadline:g} s)"
                    return oldest, _fit_result(None, silent)
                time.sleep(POLL_SECONDS)

        def next_job(node: int, name: str) -> None:
            """The site's next job, on the newest model, starting now."""
            if speeds is None:
                if node in set(grid.get_node_ids()):
                    send(node, version)
                else:
                    log.warning("site %s left the asynchronous run", name)
                return
            if node not in sites:
                return  # never answered: no speed to schedule it by
            site = sites[node]
            message_id = send(node, version)
            finishes = clock + speeds.job_seconds(
                site.name, site.examples, epochs, model_bytes, update_bytes
            )
            heapq.heappush(pending, _Job(finishes, node, version, message_id, clock, jobs[node]))

        def secure_sum(step: int, members: list[tuple[_Job, Any]]) -> BufferSum:
            """The buffer's SecAgg+ round among the sites holding ``members``' updates."""
            counted = Traffic()
            result = secure_buffer_sum(
                grid, context, workflow, step,
                {job.node: (job.number, staleness_weight(version - job.version))
                 for job, _res in members},
                settings.fit_config(step, job_deadline), counted, settings.secagg.max_weight,
            )  # fmt: skip
            for site in counted.of_round(step).values():
                traffic["in"] += site.train_in
                traffic["out"] += site.train_out
            return result

        step_began = clock
        for step in range(1, settings.rounds + 1):
            wall_start, started_at = time.perf_counter(), datetime.now(timezone.utc)
            for listener in round_starts:
                listener.on_round_start(RoundInFlight(
                    step + settings.round_offset, started_at,
                    job_deadline if speeds is None else None, buffer_size,
                    len(sites) or len(running),
                ))  # fmt: skip
            members: list[tuple[_Job, Any]] = []
            dropped: list[SiteResult] = []
            waited, carried[:] = list(carried), []
            while len(members) < buffer_size or (
                len(claimed) < bounding and not answered.issuperset(nodes)
            ):  # the first step: its bounds need three sites' figures, or every site's word
                if waited:  # one from each site that waited for this buffer, first
                    job, outcome = waited.pop(0)
                    traffic["in"] += outcome.res.metrics[UPLINK_BYTES_METRIC]
                else:
                    job, outcome = next_real() if speeds is None else next_simulated()
                learn(job.node, outcome)
                answered.add(job.node)
                name = name_of(job.node)
                staleness = version - job.version
                res = outcome.res
                if res is None:
                    dropped.append(SiteResult(name, outcome.status, reason=outcome.reason,
                                              metrics={"node_id": str(job.node)}))  # fmt: skip
                elif max_staleness is not None and staleness > max_staleness:
                    dropped.append(SiteResult(
                        name, "late", int(res.num_examples),
                        {"staleness": staleness, "node_id": str(job.node)},
                        reason=f"stale: trained on model step {job.version}, arrived at step "
                        f"{version}, more than --max-staleness {max_staleness} behind",
                    ))  # fmt: skip
                elif len(members) == buffer_size or any(m.node == job.node for m, _ in members):
                    heard(job.node, outcome)
                    carried.append((job, outcome))  # its next job waits until it is taken
                    traffic["in"] -= res.metrics[UPLINK_BYTES_METRIC]  # the taking step's
                    continue
                else:
                    members.append((job, res))
                    heard(job.node, outcome)
                    if secure:
                        continue  # it holds its update until the buffer's SecAgg+ round
                next_job(job.node, name)
            notes: list[str] = []
            secured = secure_sum(step + settings.round_offset, members) if secure else None
            if secured is not None:
                holders = members
                members = [(job, res) for job, res in holders if job.node in secured.delivered]
                for job, res in holders:
                    if job.node in secured.dropped:
                        status, reason = secured.dropped[job.node]
                        dropped.append(SiteResult(
                            sites[job.node].name, status, int(res.num_examples),
                            {"staleness": version - job.version, "node_id": str(job.node)},
                            reason=reason,
                        ))  # fmt: skip
                if secured.update is None:
                    notes.append("the buffer's SecAgg+ round failed: the model did not move")
            update, train_metrics, member_results, weighed = _apply(
                models, version, members, sites,
                float("inf") if secure else count_bound(list(claimed.values())),
                None if secure else pulls,
            )
            notes.extend(weighed)
            if secured is not None:  # the flat SecAgg+ sum, in the model's shapes
                update = (
                    unflatten(secured.update, models[version]) if secured.update is not None
                    else [np.zeros_like(w) for w in models[version]]
                )  # fmt: skip
            moved = [w + (server_lr * u).astype(w.dtype) for w, u in zip(models[version], update)]
            problem = update_problem(moved, models[version])
            if problem is not None:
                notes.append(f"the buffer's step was not taken, the model kept: {problem}")
                log.warning("step %s not taken, the model kept: %s", step, problem)
                moved = models[version]
            version += 1
            models[version] = moved
            out = pending if speeds is not None else list(running.values())
            referenced = {job.version for job in out} | {job.version for job, _ in carried}
            referenced.add(version)
            for old in [v for v in models if v not in referenced]:
                del models[old]
            if secured is not None:  # the buffer's sites start their next jobs on it
                for job, _res in holders:
                    next_job(job.node, sites[job.node].name)
            kept = {site.site_id for site in member_results}
            more: dict[tuple[str, str], list[SiteResult]] = {}
            for site in dropped:  # one row a site a round; the rest, one note a site and status
                if site.site_id in kept:
                    more.setdefault((site.site_id, site.status), []).append(site)
                else:
                    kept.add(site.site_id)
                    member_results.append(site)
            for (site_id, status), extra in more.items():
                notes.append(f"site {site_id}: {len(extra)} more update(s) {status}, the last: "
                             f"{extra[-1].reason}")  # fmt: skip
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
                deadline_seconds=job_deadline if speeds is None else None,
                simulated_seconds=None if speeds is None else clock - step_began,
                simulated_clock=None if speeds is None else clock,
                bytes_in=traffic["in"],
                bytes_out=traffic["out"],
            )
            step_began = clock
            traffic["in"] = traffic["out"] = 0  # step 1 holds the first jobs, too
            for listener in told:
                listener.on_round(summary)

    return app


def _apply(
    models: dict[int, list[np.ndarray]],
    version: int,
    members: list[tuple[_Job, Any]],
    sites: dict[int, _Site],
    bound: float,
    pulls: dict[int, float] | None,
) -> tuple[list[np.ndarray], dict[str, float], list[SiteResult], list[str]]:
    """The buffer's step (``models[version] + update``), its training metrics weighted by
    examples, each member site's record (its staleness among its metrics), and one note per
    member whose count weighed in as ``bound`` (``site_weights.count_bound``) instead, or
    whose change was scaled down to the pull bound.

    ``pulls``: each site's latest change (L2 norm of its model less the step it trained on);
    a member's change counts at most ``PULL_TIMES_MEDIAN`` times their median (``None``: no
    bound, the SecAgg+ buffers, whose changes the coordinator never sees).
    """
    counts = [min(max(int(res.num_examples), 0), bound) for _, res in members]
    total = float(sum(counts)) or 1.0
    changes = []
    for job, res in members:
        weights = parameters_to_ndarrays(res.parameters)
        change = [new.astype(np.float64) - old for new, old in zip(weights, models[job.version])]
        changes.append((change, float(np.sqrt(sum(float(np.sum(c * c)) for c in change)))))
    pull_bound = (
        float("inf") if pulls is None else count_bound(list(pulls.values()), PULL_TIMES_MEDIAN)
    )
    update = [np.zeros_like(w) for w in models[version]]
    sums: dict[str, float] = {}
    recorded: list[SiteResult] = []
    notes: list[str] = []
    for (job, res), count, (change, norm) in zip(members, counts, changes):
        if count < res.num_examples:
            notes.append(bounded_note(job.node, res.num_examples, int(count), "run's"))
        scale = min(1.0, pull_bound / norm) if norm > 0 else 1.0
        if scale * MAX_TIMES_MEDIAN < 1.0:
            notes.append(
                f"site {job.node} changed the model by {norm:.3g} (L2), more than "
                f"{MAX_TIMES_MEDIAN:g} x the run's median site; counted as {pull_bound:.3g}"
            )
        share = count / total
        staleness = version - job.version
        factor = share * staleness_weight(staleness) * scale
        for target, part in zip(update, change):
            target += (factor * part).astype(target.dtype)
        metrics = bounded_site_metrics(res.metrics)
        for name, value in metrics.items():
            if name.startswith("train_") and isinstance(value, (int, float)):
                sums[name] = sums.get(name, 0.0) + share * float(value)
        metrics = {k: v for k, v in metrics.items() if k != SITE_NAME_METRIC}
        seconds = metrics.get(SIMULATED_SECONDS_METRIC)
        recorded.append(SiteResult(
            sites[job.node].name, "ok", int(res.num_examples),
            {**metrics, "staleness": staleness, "node_id": str(job.node)},
            seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
        ))  # fmt: skip
    return update, sums, recorded, notes


def _wait_for_nodes(grid: Grid, needed: int, timeout: float = 600.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= needed:
            return nodes
        if time.monotonic() > deadline:
            raise UserError(f"only {len(nodes)} of {needed} sites connected")
        time.sleep(0.5)
