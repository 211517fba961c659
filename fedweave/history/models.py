"""SQLAlchemy 2 typed models of the round history (one schema for federated and gossip).

The schema itself is owned by the Alembic migrations in ``migrations/versions``; these
classes must describe the same tables (``tests/test_history_migrations.py`` checks that
autogenerate finds no difference). Change both together, in a new migration.

Gossip fits the same tables: a round's ``actor`` is the peer id and its site rows are the
neighbours it exchanged with; federated rounds use the actor ``"coordinator"``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

SCHEMA_REVISION = "0008"
"""The Alembic revision these models describe; equal to the newest migration (tested)."""

RUN_MODES = ("federated", "gossip")
RUN_STATUSES = ("running", "completed", "completed-alone", "failed", "interrupted")
"""``completed-alone``: a gossip peer ran its rounds, but more than its bound without partners."""
SITE_STATUSES = ("ok", "failed", "rejected", "late", "refused", "lost")
"""``refused``: the site cannot take part in the run and said why; ``lost``: the SuperLink
lost the site mid-round; ``late``: no reply by the round deadline."""

AUDIT_OUTCOMES = ("done", "refused")
"""``refused``: what was asked was not done (an unknown or removed token, an invalid request);
the entry says who asked, from where, and why."""

SUBMISSION_STATES = ("queued", "running", "completed", "stopped", "failed")
"""A study an operator submitted to a serving coordinator: waiting its turn, its run under way,
or ended (``completed``; ``stopped`` by an operator, before or during its run; ``failed``:
refused when its turn came, or its run failed)."""

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, so migrations can drop/alter them on every backend."""


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends.

    SQLite has no time zones; without this, SQLite would hand back naive datetimes and
    PostgreSQL aware ones, and comparisons across the two would break. Naive input is UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


JSONType = JSON().with_variant(JSONB(), "postgresql")
"""JSON text on SQLite, JSONB on PostgreSQL (queryable, compact)."""


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base with the naming convention above."""

    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONType, datetime: UTCDateTime()}


class Run(Base):
    """One training run: its config, code version, lifecycle and liveness (pid/host/heartbeat)."""

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_in("mode", RUN_MODES), name="mode"),
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
    )

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))
    task: Mapped[str] = mapped_column(String(255))
    config: Mapped[dict[str, Any]]
    seed: Mapped[int | None] = mapped_column(BigInteger)
    code_version: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), index=True)
    started_at: Mapped[datetime] = mapped_column(index=True)
    ended_at: Mapped[datetime | None]
    reason: Mapped[str | None] = mapped_column(Text)
    pid: Mapped[int | None] = mapped_column(Integer)
    hostname: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None]
    round_in_flight: Mapped[dict[str, Any] | None]
    """The coordinator's round now under way (``records.RoundInFlight`` as a dict), set when it
    starts and cleared when it is recorded or the run ends: what a live view counts down."""

    rounds: Mapped[list[Round]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class Round(Base):
    """One completed round of one actor; (run_id, actor, round) is unique."""

    __tablename__ = "rounds"
    __table_args__ = (
        UniqueConstraint("run_id", "actor", "round", name="uq_rounds_run_actor_round"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id", ondelete="CASCADE"))
    actor: Mapped[str] = mapped_column(String(255))
    round: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime]
    sampled: Mapped[int] = mapped_column(Integer, default=0)
    replied: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    train_metrics: Mapped[dict[str, Any]]
    eval_loss: Mapped[float | None] = mapped_column(Float)
    eval_accuracy: Mapped[float | None] = mapped_column(Float)
    model_sha256: Mapped[str | None] = mapped_column(String(64))
    bytes_in: Mapped[int | None] = mapped_column(BigInteger)
    bytes_out: Mapped[int | None] = mapped_column(BigInteger)
    extra: Mapped[dict[str, Any]]

    run: Mapped[Run] = relationship(back_populates="rounds")
    sites: Mapped[list[SiteRow]] = relationship(
        back_populates="round_row",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="SiteRow.site_id",
    )
    checkpoint: Mapped[Checkpoint | None] = relationship(
        back_populates="round_row", cascade="all, delete-orphan", passive_deletes=True
    )


class SiteRow(Base):
    """One site's (or gossip neighbour's) part in one round."""

    __tablename__ = "site_results"
    __table_args__ = (
        CheckConstraint(_in("status", SITE_STATUSES), name="status"),
        UniqueConstraint("round_id", "site_id", name="uq_site_results_round_site"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"))
    site_id: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))
    num_examples: Mapped[int] = mapped_column(BigInteger, default=0)
    metrics: Mapped[dict[str, Any]]
    seconds: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)

    round_row: Mapped[Round] = relationship(back_populates="sites")


class Checkpoint(Base):
    """The model file written for a round (at most one per round row)."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), unique=True)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)

    round_row: Mapped[Round] = relationship(back_populates="checkpoint")


OPERATOR_ROLES = ("submit", "read-own", "read-all", "stop-own", "stop-all", "admin")
"""What an operator may be allowed at the door (``admin``: everything)."""
DEFAULT_OPERATOR_ROLES = "submit,read-own,stop-own"
"""An operator's roles unless its administrator gives others: its own studies only."""


class Operator(Base):
    """Someone who may submit, stop and change runs at a serving coordinator (issue 38): a
    name and the sha256 of the token made for it (the token itself is stored nowhere).
    A removed operator's row stays, so the audit trail keeps naming who it was."""

    __tablename__ = "operators"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    added_at: Mapped[datetime]
    added_by: Mapped[str] = mapped_column(String(255))
    removed_at: Mapped[datetime | None]
    roles: Mapped[str] = mapped_column(String(255), server_default=DEFAULT_OPERATOR_ROLES)
    """What the operator may do at the door, comma-separated (``OPERATOR_ROLES``)."""


class AuditEntry(Base):
    """One thing done, or refused, at the coordinator's operator door or by its operator
    commands: when, by whom (an operator's name, or what an unknown caller showed), from
    which address, what and on what."""

    __tablename__ = "audit"
    __table_args__ = (CheckConstraint(_in("outcome", AUDIT_OUTCOMES), name="outcome"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(255))
    address: Mapped[str | None] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)


class Submission(Base):
    """A study submitted to a serving coordinator by an operator (issue 38): the config it
    was given, its place in the queue and, once it runs, its history run."""

    __tablename__ = "submissions"
    __table_args__ = (CheckConstraint(_in("state", SUBMISSION_STATES), name="state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    submitted_at: Mapped[datetime]
    operator: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(255))
    config_toml: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), index=True)
    run_id: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    stop_requested_by: Mapped[str | None] = mapped_column(String(64))
    ended_at: Mapped[datetime | None]
