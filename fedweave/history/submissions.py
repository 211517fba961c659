"""Studies submitted to a serving coordinator by its operators, in the history (issue 38).

A submission is queued with the study's config as it was sent; the coordinator takes the
oldest queued one when it is free, records the history run it started, and its end. An
operator's stop ends a queued submission at once and asks the coordinator to stop a running
one (``stop_requested_by``), which it does within a poll. Every state is in the database, so
a restarted coordinator takes up the queue where it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from fedweave.history.models import Submission
from fedweave.history.store import HistoryStore
from fedweave.history.store_errors import HistoryError

MAX_CONFIG_BYTES = 256 * 1024
"""The largest study config a submission keeps (a TOML file of settings is a few KB)."""
ENDED = ("completed", "stopped", "failed")


@dataclass(frozen=True)
class SubmissionInfo:
    """One submission as ``fedweave run list`` and ``show`` give it."""

    id: int
    submitted_at: datetime
    operator: str
    source: str
    config_toml: str
    state: str
    run_id: str | None
    reason: str | None
    stop_requested_by: str | None
    ended_at: datetime | None

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "submitted_at": self.submitted_at.isoformat(),
            "operator": self.operator,
            "source": self.source,
            "state": self.state,
            "run_id": self.run_id,
            "reason": self.reason,
            "stop_requested_by": self.stop_requested_by,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
        }


def _info(row: Submission) -> SubmissionInfo:
    return SubmissionInfo(
        row.id, row.submitted_at, row.operator, row.source, row.config_toml, row.state,
        row.run_id, row.reason, row.stop_requested_by, row.ended_at,
    )  # fmt: skip


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Submissions:
    """The queue of submitted studies in one history database (``store``'s)."""

    def __init__(self, store: HistoryStore) -> None:
        self._store = store

    def _row(self, session: Session, submission: int) -> Submission:
        row = session.get(Submission, submission)
        if row is None:
            raise HistoryError(f"no submission {submission}; `fedweave run list` shows them")
        return row

    def submit(self, operator: str, source: str, config_toml: str) -> int:
        """Queue a study; its number."""
        if len(config_toml.encode()) > MAX_CONFIG_BYTES:
            raise HistoryError(f"a study config is at most {MAX_CONFIG_BYTES // 1024} KB")

        def work(session: Session, _attempt: int) -> int:
            row = Submission(
                submitted_at=_now(), operator=operator[:64], source=source[:255],
                config_toml=config_toml, state="queued",
            )  # fmt: skip
            session.add(row)
            session.flush()
            return int(row.id)

        return self._store._write(work)

    def get(self, submission: int) -> SubmissionInfo:
        """One submission; ``HistoryError`` where there is none of that number."""
        with self._store._reading() as session:
            return _info(self._row(session, submission))

    def of_run(self, run_id: str) -> SubmissionInfo | None:
        """The submission whose history run is ``run_id``; None for a run no operator submitted
        (the coordinator's command line)."""
        with self._store._reading() as session:
            row = session.scalars(select(Submission).where(Submission.run_id == run_id)).first()
            return _info(row) if row is not None else None

    def all(self, limit: int = 200) -> list[SubmissionInfo]:
        """The newest ``limit`` submissions, oldest first."""
        with self._store._reading() as session:
            rows = session.scalars(
                select(Submission).order_by(Submission.id.desc()).limit(max(0, limit))
            ).all()
            return [_info(row) for row in reversed(rows)]

    def next_queued(self, skip: frozenset[int] = frozenset()) -> SubmissionInfo | None:
        """The oldest queued submission, if any, but those in ``skip`` (taken already)."""
        with self._store._reading() as session:
            query = select(Submission).where(Submission.state == "queued")
            if skip:
                query = query.where(Submission.id.not_in(sorted(skip)))
            row = session.scalars(query.order_by(Submission.id)).first()
            return None if row is None else _info(row)

    def queue_position(self, submission: int) -> int:
        """How many queued submissions are ahead of this one (0: it is next)."""
        with self._store._reading() as session:
            ids = session.scalars(
                select(Submission.id).where(Submission.state == "queued").order_by(Submission.id)
            ).all()
            return ids.index(submission) if submission in ids else 0

    def started(self, submission: int, run_id: str) -> bool:
        """Record that its run ``run_id`` started (or resumed); False where it was stopped
        meanwhile."""

        def work(session: Session, _attempt: int) -> bool:
            row = self._row(session, submission)
            if row.state != "queued":
                return False
            row.state, row.run_id, row.reason = "running", run_id, None
            return True

        return self._store._write(work, retry_seconds=10.0)

    def note(self, submission: int, reason: str | None) -> None:
        """Say why a running submission waits (``None``: it no longer does)."""

        def work(session: Session, _attempt: int) -> None:
            row = self._row(session, submission)
            if row.state == "running":
                row.reason = reason

        self._store._write(work, retry_seconds=10.0)

    def ended(self, submission: int, state: str, reason: str | None = None) -> None:
        """Record its end: ``completed``, ``stopped`` or ``failed``, with why."""
        if state not in ENDED:
            raise ValueError(f"state must be one of {ENDED}, not {state!r}")

        def work(session: Session, _attempt: int) -> None:
            row = self._row(session, submission)
            if row.state in ENDED:
                return
            row.state, row.reason, row.ended_at = state, reason, _now()

        self._store._write(work, retry_seconds=10.0)

    def request_stop(self, submission: int, operator: str) -> str:
        """Stop a submission: a queued one ends now (``stopped``), a running one is marked
        for the coordinator to stop. Returns the state it was in; ``HistoryError`` where it
        has ended already."""

        def work(session: Session, _attempt: int) -> str:
            row = self._row(session, submission)
            if row.state in ENDED:
                raise HistoryError(
                    f"submission {submission} is not running: it {row.state} already"
                )
            state = row.state
            row.stop_requested_by = operator[:64]
            if state == "queued":
                row.state, row.ended_at = "stopped", _now()
                row.reason = f"stopped by operator {operator} before it started"
            return state

        return self._store._write(work)

    def requeue(self, submission: int, reason: str) -> bool:
        """Put a running submission back in the queue, its run kept (``run_id``): it
        resumes that run when its turn comes (a coordinator stopped during it). False where
        it is not running (ended, or an operator stopped it meanwhile)."""

        def work(session: Session, _attempt: int) -> bool:
            row = self._row(session, submission)
            if row.state != "running" or row.stop_requested_by is not None:
                return False
            row.state, row.reason = "queued", reason
            return True

        return self._store._write(work, retry_seconds=10.0)

    def requeue_running(self, reason: str) -> list[int]:
        """Put every submission left ``running`` (by a coordinator that died during it) back
        in the queue to resume its run, but those an operator asked to stop (ended
        ``stopped``); their numbers, requeued ones only."""

        def work(session: Session, _attempt: int) -> list[int]:
            rows = session.scalars(select(Submission).where(Submission.state == "running")).all()
            requeued = []
            for row in rows:
                if row.stop_requested_by is not None:
                    row.state, row.ended_at = "stopped", _now()
                    row.reason = f"stopped by operator {row.stop_requested_by}"
                elif row.run_id is None:  # never got a run: nothing to resume
                    row.state, row.reason, row.ended_at = "failed", reason, _now()
                else:
                    row.state, row.reason = "queued", reason
                    requeued.append(int(row.id))
            return requeued

        return self._store._write(work)
