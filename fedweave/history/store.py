"""The history store: the repository functions both modes call to record runs and rounds.

Callers hand over plain records (``fedweave.history.records``) and get plain records or
dicts back; sessions never leave this module. Every write is one short transaction, so a
round, its site rows and its checkpoint row are recorded together or not at all, and
several processes (gossip peers) can write the same database.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import (
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session

from fedweave import __version__
from fedweave.config.sections import DEFAULT_DB_URL
from fedweave.errors import mask_url_password
from fedweave.history.convert import jsonable, round_dict, round_row, run_info, site_dict
from fedweave.history.engine import (
    DEFAULT_BUSY_TIMEOUT_MS,
    WRITE_OPTION,
    describe_connect_error,
    make_engine,
    sqlite_file,
)
from fedweave.history.liveness import STALE_AFTER_S, run_is_dead, this_host
from fedweave.history.migrate import ensure_schema
from fedweave.history.models import RUN_MODES, SITE_STATUSES, Checkpoint, Round, Run, SiteRow
from fedweave.history.records import (
    CheckpointRef,
    RoundInFlight,
    RoundRecord,
    RunInfo,
    SiteResult,
    SitesWait,
)
from fedweave.history.store_errors import DuplicateRoundError, HistoryError, HistoryUnavailableError
from fedweave.private_files import create_private

T = TypeVar("T")
FINISHED_STATUSES = ("completed", "completed-alone", "failed", "interrupted")


def _now() -> datetime:
    return datetime.now(timezone.utc)


SQLITE_FULL = 13
"""SQLite's result code for a full disk (``sqlite3.Error.sqlite_errorcode``'s primary code)."""
POSTGRES_DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE ``disk_full``."""


def _disk_full(exc: DBAPIError) -> bool:
    """Whether the database said its disk is full, by its own error code."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
        return True
    return getattr(exc.orig, "sqlstate", None) == POSTGRES_DISK_FULL


def _first_line(exc: BaseException) -> str:
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return mask_url_password(lines[0]) if lines else type(exc).__name__


def open_store(
    url: str | None = None,
    migrate: bool = True,
    *,
    stale_after_s: float = STALE_AFTER_S,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    read_only: bool = False,
) -> HistoryStore:
    """Open (and by default migrate) the history database at ``url``.

    Call it before any training: a wrong or unreachable URL raises ``UserError`` (a
    ``HistoryUnavailableError``) naming the URL with its password masked.

    Args:
        url: SQLAlchemy URL; None means ``DEFAULT_DB_URL`` (``sqlite:///fedweave.db``).
        migrate: apply pending migrations (default True); False refuses an old schema.
        stale_after_s: heartbeat age after which a running run of another host is taken
            as interrupted (default 600 s).
        busy_timeout_ms: SQLite only, how long a writer waits for the file lock (5000 ms).
        read_only: a reader that changes nothing (the dashboard): no migration (an old schema
            is refused with the migrate hint) and no marking of dead runs as interrupted.
    """
    if read_only:
        migrate = False
    url = url or DEFAULT_DB_URL
    engine = make_engine(url, busy_timeout_ms)
    path = sqlite_file(url)
    if path is not None and not read_only and path.parent.is_dir():
        create_private(path)  # SQLite makes its journal files with the database's mode
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except (DBAPIError, OSError) as exc:
        engine.dispose()
        raise HistoryUnavailableError(describe_connect_error(url, exc)) from None
    try:
        ensure_schema(engine, url, migrate)
    except HistoryError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise HistoryError(
            f"cannot prepare the schema of '{mask_url_password(url)}': {_first_line(exc)}; "
            "point --db at a fedweave history database (or an empty one)"
        ) from None
    store = HistoryStore(engine, url, stale_after_s=stale_after_s)
    if read_only:
        return store
    try:
        store.detect_interrupted()
    except HistoryError:  # best effort: e.g. a read-only user may still list runs
        pass
    return store


class HistoryStore:
    """Repository over one history database; thread-safe (one short session per call)."""

    def __init__(self, engine: Engine, url: str, stale_after_s: float = STALE_AFTER_S) -> None:
        """Use ``open_store`` instead: it checks reachability and the schema first."""
        self._engine = engine
        self.url = url
        self.masked_url = mask_url_password(url)
        self.stale_after_s = stale_after_s

    # -- plumbing -----------------------------------------------------------------------

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release pooled connections (the store cannot be used afterwards)."""
        self._engine.dispose()

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        try:
            with Session(self._engine) as session:
                yield session
        except DBAPIError as exc:
            raise HistoryUnavailableError(
                f"history database '{self.masked_url}' failed: {_first_line(exc)}; "
                "check that it is reachable"
            ) from None

    def _write(self, work: Callable[[Session, int], T], retry_seconds: float = 0.0) -> T:
        """Run ``work(session, attempt)`` in one write transaction, retrying lost connections.

        Operational errors (server gone, connection dropped, SQLite lock held too long) are
        retried with backoff for ``retry_seconds``; other database errors are not (they
        would fail again) and integrity errors are left to the caller to explain.
        """
        deadline = time.monotonic() + retry_seconds
        delay, attempt = 0.1, 0
        while True:
            attempt += 1
            try:
                with self._engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
                    with Session(bind=conn) as session, session.begin():
                        return work(session, attempt)
            except IntegrityError:
                raise
            except DBAPIError as exc:
                if _disk_full(exc):  # waiting frees no space: the run stops at its first write
                    raise HistoryError(
                        f"history database '{self.masked_url}' is full (no space left on its "
                        "disk; nothing written): free space there or move it, then resume the "
                        "run"
                    ) from None
                transient = exc.connection_invalidated or isinstance(
                    exc, (OperationalError, InterfaceError)
                )
                if not transient:  # e.g. a value too long for its column: retrying cannot help
                    raise HistoryError(
                        f"history database '{self.masked_url}' refused the "
                        f"write (nothing written): {_first_line(exc)}"
                    ) from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HistoryUnavailableError(
                        f"history database '{self.masked_url}' unavailable "
                        f"(gave up after {attempt} attempt(s) in {retry_seconds:g} s): "
                        f"{_first_line(exc)}; check the database, then resume the run"
                    ) from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 2.0)

    def _run_row(self, session: Session, run_id: str) -> Run:
        run = session.get(Run, run_id)
        if run is None:
            raise HistoryError(
                f"no run '{run_id}' in '{self.masked_url}'; "
                "list runs with `fedweave history runs --db URL`"
            )
        return run

    # -- runs ---------------------------------------------------------------------------

    def start_run(
        self,
        mode: str,
        task: str,
        config: dict[str, Any],
        seed: int | None,
        run_id: str | None = None,
    ) -> str:
        """Record a new run as ``running`` with this process's pid/host; return its id.

        ``run_id`` defaults to a fresh 12-hex-digit id; an id already present is refused.
        """
        if mode not in RUN_MODES:
            raise ValueError(f"mode must be one of {RUN_MODES}, not {mode!r}")
        new_id = run_id or uuid.uuid4().hex[:12]
        now = _now()

        def work(session: Session, _attempt: int) -> str:
            if session.get(Run, new_id) is not None:
                raise HistoryError(
                    f"run '{new_id}' already exists in '{self.masked_url}'; "
                    "resume it or choose another run id"
                )
            session.add(
                Run(
                    run_id=new_id,
                    mode=mode,
                    task=task,
                    config=jsonable(config),
                    seed=seed,
                    code_version=__version__,
                    status="running",
                    started_at=now,
                    ended_at=None,
                    reason=None,
                    pid=os.getpid(),
                    hostname=this_host(),
                    heartbeat_at=now,
                )
            )
            return new_id

        try:
            return self._write(work)
        except IntegrityError:  # another process inserted the same id between check and insert
            raise HistoryError(
                f"run '{new_id}' already exists in '{self.masked_url}'; "
                "resume it or choose another run id"
            ) from None

    def finish_run(
        self, run_id: str, status: str, reason: str | None = None, retry_seconds: float = 10.0,
        only_if_running: bool = False,
    ) -> None:
        """Set the final status (``FINISHED_STATUSES``) and the end time; with
        ``only_if_running``, only where nobody has ended the run yet (its row read under a
        lock, so an end recorded meanwhile is kept)."""
        if status not in FINISHED_STATUSES:
            raise ValueError(f"status must be one of {FINISHED_STATUSES}, not {status!r}")

        def work(session: Session, _attempt: int) -> None:
            run = self._run_row(session, run_id)
            if only_if_running:
                session.refresh(run, with_for_update=True)
                if run.status != "running":
                    return
            run.status, run.reason, run.ended_at = status, reason, _now()
            run.round_in_flight = None

        self._write(work, retry_seconds)

    def note_round_started(
        self, run_id: str, started: RoundInFlight, retry_seconds: float = 2.0
    ) -> None:
        """Keep ``started`` as the run's round under way (and refresh its heartbeat) until the
        round is recorded or the run ends."""

        def work(session: Session, _attempt: int) -> None:
            self._touch(session, run_id)
            run = self._run_row(session, run_id)
            run.round_in_flight = jsonable(
                {
                    "round": started.round,
                    "started_at": started.started_at,
                    "deadline_seconds": started.deadline_seconds,
                    "sampled": started.sampled,
                    "connected": started.connected,
                }
            )

        self._write(work, retry_seconds)

    def note_sites_wait(
        self, run_id: str, waiting: SitesWait | None, retry_seconds: float = 2.0
    ) -> None:
        """Keep ``waiting`` as the run's wait for sites (beside its round under way), or clear
        it (``None``); cleared with the round too."""

        def work(session: Session, _attempt: int) -> None:
            self._touch(session, run_id)
            run = self._run_row(session, run_id)
            in_flight = {k: v for k, v in (run.round_in_flight or {}).items() if k != "waiting"}
            if waiting is not None:
                in_flight["waiting"] = jsonable(
                    {
                        "since": waiting.since,
                        "connected": waiting.connected,
                        "needed": waiting.needed,
                        "missing": list(waiting.missing),
                        "gives_up_at": waiting.gives_up_at,
                    }
                )
            run.round_in_flight = in_flight or None

        self._write(work, retry_seconds)

    def mark_running(self, run_id: str) -> None:
        """Resume: status back to running, end/reason cleared, this process as the owner."""

        def work(session: Session, _attempt: int) -> None:
            run = self._run_row(session, run_id)
            now = _now()
            run.status, run.ended_at, run.reason = "running", None, None
            run.pid, run.hostname, run.heartbeat_at = os.getpid(), this_host(), now

        self._write(work)

    def _touch(self, session: Session, run_id: str) -> None:
        # An "interrupted" run that still writes was a false alarm (its heartbeat lagged).
        run = self._run_row(session, run_id)
        run.heartbeat_at = _now()
        if run.status == "interrupted":
            run.status, run.ended_at, run.reason = "running", None, None

    def detect_interrupted(self) -> list[str]:
        """Mark running runs whose process died as interrupted; return their ids.

        Called by ``open_store``: a crash cannot record its own end, so the next start does.
        """
        now = _now()
        with self._reading() as session:
            running = session.execute(
                select(Run.run_id, Run.pid, Run.hostname, Run.heartbeat_at).where(
                    Run.status == "running"
                )
            ).all()
        dead = [
            row
            for row in running
            if run_is_dead(row.pid, row.hostname, row.heartbeat_at, now, self.stale_after_s)
        ]
        for row in dead:
            reason = f"process {row.pid} on {row.hostname} died (found at a later start)"
            self._write(
                lambda session, _a, row=row, reason=reason: session.execute(
                    update(Run)
                    .where(Run.run_id == row.run_id, Run.status == "running")
                    .values(status="interrupted", reason=reason, ended_at=row.heartbeat_at or now)
                )
            )
        return [row.run_id for row in dead]

    # -- rounds -------------------------------------------------------------------------

    def record_round(
        self,
        run_id: str,
        record: RoundRecord,
        sites: list[SiteResult],
        checkpoint: CheckpointRef | None = None,
        retry_seconds: float = 30.0,
    ) -> None:
        """Write one round, its site results and its checkpoint in one transaction.

        Refreshes the run's heartbeat (and turns an ``interrupted`` run back to running:
        its process is evidently alive); a finished run keeps its status. Raises
        ``DuplicateRoundError`` (nothing written) if (run, actor, round) exists, and
        ``HistoryUnavailableError`` after ``retry_seconds`` (default 30) of failing to reach
        the database; the caller then fails the run.
        """
        if checkpoint is not None and checkpoint.round != record.round:
            raise ValueError(f"checkpoint is of round {checkpoint.round}, not {record.round}")
        for site in sites:
            if site.status not in SITE_STATUSES:
                raise ValueError(f"site status must be one of {SITE_STATUSES}, not {site.status!r}")
        row = round_row(run_id, record, sites, checkpoint)

        def work(session: Session, attempt: int) -> None:
            self._touch(session, run_id)
            existing = session.scalar(
                select(Round).where(
                    Round.run_id == run_id, Round.actor == record.actor, Round.round == record.round
                )
            )
            if existing is not None:
                if attempt > 1 and _same_round(existing, row):
                    return  # our earlier attempt committed but its acknowledgement was lost
                raise DuplicateRoundError(
                    f"round {record.round} of actor '{record.actor}' is already recorded for "
                    f"run '{run_id}'; nothing was written (resume from round "
                    f"{record.round + 1})"
                )
            session.add(row)
            run = self._run_row(session, run_id)
            in_flight = run.round_in_flight or {}
            if in_flight and int(in_flight.get("round", 0)) <= record.round:
                run.round_in_flight = None
            session.flush()

        try:
            self._write(work, retry_seconds)
        except IntegrityError as exc:
            raise HistoryError(
                f"round {record.round} of run '{run_id}' was not recorded (nothing written): "
                f"{_first_line(exc)}"
            ) from None

    def add_checkpoint(
        self,
        run_id: str,
        actor: str,
        round: int,
        checkpoint: CheckpointRef,
        retry_seconds: float = 10.0,
    ) -> None:
        """Attach ``checkpoint`` to the recorded round ``round`` of ``actor`` (a gossip peer
        leaving between its every-N checkpoints writes its last round's model then)."""
        if checkpoint.round != round:
            raise ValueError(f"checkpoint is of round {checkpoint.round}, not {round}")

        def work(session: Session, _attempt: int) -> None:
            row = session.scalar(
                select(Round).where(
                    Round.run_id == run_id, Round.actor == actor, Round.round == round
                )
            )
            if row is None:
                raise HistoryError(
                    f"round {round} of actor '{actor}' is not recorded in run "
                    f"'{run_id}'; no checkpoint attached"
                )
            if row.checkpoint is None:
                row.checkpoint = Checkpoint(
                    path=str(checkpoint.path),
                    sha256=checkpoint.sha256,
                    size_bytes=checkpoint.size_bytes,
                )

        self._write(work, retry_seconds)

    def discard_rounds_after(self, run_id: str, actor: str, round: int) -> int:
        """Delete ``actor``'s rounds after ``round`` (with their site rows and checkpoint
        rows); returns how many. A gossip peer resuming from its checkpoint of ``round``
        runs those rounds again, so their old rows would only collide."""

        def work(session: Session, _attempt: int) -> int:
            rows = list(
                session.scalars(
                    select(Round).where(
                        Round.run_id == run_id, Round.actor == actor, Round.round > round
                    )
                )
            )
            for row in rows:
                session.delete(row)
            return len(rows)

        return self._write(work)

    def first_round(self, run_id: str, actor: str) -> int | None:
        """The lowest round ``actor`` recorded in ``run_id`` (None if it recorded none)."""
        with self._reading() as session:
            return session.scalar(
                select(func.min(Round.round)).where(Round.run_id == run_id, Round.actor == actor)
            )

    # -- reads --------------------------------------------------------------------------

    def _infos(self, session: Session, runs: list[Run]) -> list[RunInfo]:
        ids = [run.run_id for run in runs]
        stats = (
            {
                rid: (top or 0, actors)
                for rid, top, actors in session.execute(
                    select(Round.run_id, func.max(Round.round), func.count(Round.actor.distinct()))
                    .where(Round.run_id.in_(ids))
                    .group_by(Round.run_id)
                )
            }
            if ids
            else {}
        )
        return [run_info(run, *stats.get(run.run_id, (0, 0))) for run in runs]

    def list_runs(self) -> list[RunInfo]:
        """All runs, most recently started first."""
        with self._reading() as session:
            runs = list(
                session.scalars(select(Run).order_by(Run.started_at.desc(), Run.run_id.desc()))
            )
            return self._infos(session, runs)

    def get_run(self, run_id_or_latest: str) -> RunInfo:
        """A run by id, unique id prefix (4+ characters), or ``"latest"`` (last started)."""
        return self._infos_for(self.resolve_run_id(run_id_or_latest))

    def _infos_for(self, run_id: str) -> RunInfo:
        with self._reading() as session:
            return self._infos(session, [self._run_row(session, run_id)])[0]

    def resolve_run_id(self, ref: str) -> str:
        """The full run id ``ref`` stands for; ``UserError`` when none or ambiguous."""
        with self._reading() as session:
            if ref == "latest":
                found = session.scalar(
                    select(Run.run_id).order_by(Run.started_at.desc(), Run.run_id.desc()).limit(1)
                )
                if found is None:
                    raise HistoryError(
                        f"no runs recorded in '{self.masked_url}' yet; "
                        "start one, or pass the --db the run used"
                    )
                return found
            if session.get(Run, ref) is not None:
                return ref
            matches = (
                list(
                    session.scalars(
                        select(Run.run_id)
                        .where(Run.run_id.startswith(ref, autoescape=True))
                        .limit(2)
                    )
                )
                if len(ref) >= 4
                else []
            )
        if len(matches) == 1:
            return matches[0]
        detail = "is ambiguous" if matches else "is not"
        raise HistoryError(
            f"run '{ref}' {detail} in '{self.masked_url}'; list runs with "
            "`fedweave history runs --db URL` (or use 'latest')"
        )

    def rounds(
        self, run_id: str, actor: str | None = None, after: int | None = None
    ) -> list[dict[str, Any]]:
        """One dict per round row (see ``convert.round_dict``), ordered by actor, round; only
        rounds numbered above ``after`` when given (a live view's next poll)."""
        query = select(Round, Checkpoint).outerjoin(Checkpoint).where(Round.run_id == run_id)
        if actor is not None:
            query = query.where(Round.actor == actor)
        if after is not None:
            query = query.where(Round.round > after)
        with self._reading() as session:
            return [
                round_dict(row, ckpt)
                for row, ckpt in session.execute(query.order_by(Round.actor, Round.round))
            ]

    def site_results(
        self, run_id: str, round: int | None = None, after: int | None = None
    ) -> list[dict[str, Any]]:
        """Site rows of a run (or of one round; or of the rounds above ``after``), ordered by
        actor, round, site id."""
        # the round's own columns are not loaded: its JSON (every site's evaluation) would be
        # decoded once per site row
        query = (
            select(SiteRow, Round.run_id, Round.actor, Round.round)
            .join(Round)
            .where(Round.run_id == run_id)
        )
        if round is not None:
            query = query.where(Round.round == round)
        if after is not None:
            query = query.where(Round.round > after)
        with self._reading() as session:
            return [
                site_dict(site, rid, actor, number)
                for site, rid, actor, number in session.execute(
                    query.order_by(Round.actor, Round.round, SiteRow.site_id)
                )
            ]

    def latest_checkpoint(self, run_id: str, actor: str | None = None) -> CheckpointRef | None:
        """The checkpoint of the highest recorded round (of ``actor`` when given), or None."""
        query = select(Checkpoint, Round.round).join(Round).where(Round.run_id == run_id)
        if actor is not None:
            query = query.where(Round.actor == actor)
        with self._reading() as session:
            found = session.execute(
                query.order_by(Round.round.desc(), Round.ended_at.desc()).limit(1)
            ).first()
        if found is None:
            return None
        ckpt, number = found
        return CheckpointRef(
            round=number, path=ckpt.path, sha256=ckpt.sha256, size_bytes=ckpt.size_bytes
        )


def _same_round(existing: Round, new: Round) -> bool:
    started = new.started_at
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    return existing.started_at == started and existing.model_sha256 == new.model_sha256
