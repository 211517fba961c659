"""Alembic, configured in code: schema checks and migrations on first use and on demand.

No ``alembic.ini`` is read at run time: ``script_location`` points at the ``migrations``
folder shipped inside the package, so an installed wheel migrates its own databases.

Several processes may open a fresh database at once (gossip peers), so every migration
runs inside one write-locked transaction: ``BEGIN IMMEDIATE`` on SQLite, a transaction-level
advisory lock on PostgreSQL. The revision is read again under the lock, so only the first
process migrates and the others find the schema already current.

Alembic itself is imported only when a migration is due: a database already at
``SCHEMA_REVISION`` is recognised with one query, which keeps ``open_store`` cheap for the
many short-lived processes (peers, CLI calls) that open it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from fedweave import __version__
from fedweave.errors import mask_url_password
from fedweave.history.engine import WRITE_OPTION
from fedweave.history.models import SCHEMA_REVISION
from fedweave.history.store_errors import SchemaMismatchError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
PG_LOCK_KEY = 0x66656477  # "fedw": advisory lock id serialising fedweave migrations


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic ``Config`` for the packaged migrations, optionally bound to ``connection``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest schema revision this code knows (e.g. ``"0001"``)."""
    head = _script().get_current_head()
    assert head is not None, "the packaged migrations have no head"
    return head


def known_revisions() -> set[str]:
    """Every revision shipped with this code."""
    return {script.revision for script in _script().walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The database's schema revision; None for an empty (never migrated) database."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that holds the migration lock; commits on success."""
    with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
            yield conn


def _refuse_newer(revision: str | None, url: str) -> None:
    if revision is not None and revision not in known_revisions():
        raise SchemaMismatchError(
            f"database schema {revision} is newer than this fedweave ({head_revision()}); "
            f"upgrade fedweave (now {__version__}) to use '{mask_url_password(url)}'"
        )


def ensure_schema(engine: Engine, url: str, migrate: bool = True) -> str:
    """Make the schema current (or check it is); return the revision in force.

    Args:
        engine: engine of the database.
        url: its URL, only for messages (the password is masked).
        migrate: apply pending migrations (default True); when False, an out-of-date
            schema raises ``SchemaMismatchError`` naming ``fedweave history migrate``.
    """
    with engine.connect() as conn:
        if inspect(conn).has_table("alembic_version"):
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        else:
            revision = None
    if revision == SCHEMA_REVISION:
        return revision
    _refuse_newer(revision, url)
    head = head_revision()
    if not migrate:
        raise SchemaMismatchError(
            f"database '{mask_url_password(url)}' has schema {revision or 'none'}, this fedweave "
            f"needs {head}; run `fedweave history migrate --db URL`"
        )
    upgrade(engine, url, "head")
    return head


def upgrade(engine: Engine, url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate forward to ``revision`` (default ``"head"``); return (before, after)."""
    with _locked(engine) as conn:
        before = current_revision(conn)
        _refuse_newer(before, url)
        from alembic import command

        command.upgrade(alembic_config(conn), revision)
        return before, current_revision(conn)


def downgrade(engine: Engine, url: str, revision: str) -> tuple[str | None, str | None]:
    """Migrate back to ``revision`` (``"base"`` drops every table). Tests and recovery only."""
    with _locked(engine) as conn:
        before = current_revision(conn)
        _refuse_newer(before, url)
        from alembic import command

        command.downgrade(alembic_config(conn), revision)
        return before, current_revision(conn)
