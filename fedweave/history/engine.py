"""Database URLs and engines: SQLite tuned for several writer processes, PostgreSQL by URL.

Why the SQLite settings: gossip peers are separate processes that may all write one file.
WAL lets readers run beside the single writer, ``busy_timeout`` makes a writer wait for the
lock instead of failing at once, and write transactions start with ``BEGIN IMMEDIATE`` so
two writers never both read first and then deadlock upgrading their locks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from fedweave.errors import UserError, mask_url_password

DEFAULT_BUSY_TIMEOUT_MS = 5000
"""How long a SQLite writer waits for another process's lock before retrying (5 s)."""

PG_CONNECT_TIMEOUT_S = 5
"""Connect timeout for PostgreSQL, so an unreachable server fails fast at open (5 s)."""

WRITE_OPTION = "fedweave_write"
"""Connection execution option: the next transaction will write (SQLite: BEGIN IMMEDIATE)."""

URL_HINT = "use sqlite:///path/to/file.db or postgresql+psycopg://user:password@host:5432/dbname"


def normalize_url(url: str) -> URL:
    """Parse ``url``; plain ``postgresql://`` / ``postgres://`` mean the psycopg 3 driver.

    SQLAlchemy would otherwise pick psycopg2, which fedweave does not install.
    Raises ``UserError`` for text that is not a supported database URL.
    """
    text = url.strip()
    for prefix in ("postgres://", "postgresql://"):
        if text.startswith(prefix):
            text = "postgresql+psycopg://" + text[len(prefix) :]
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise UserError(f"'{mask_url_password(url)}' is not a database URL; {URL_HINT}") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise UserError(
            f"database '{mask_url_password(url)}' is not supported (only SQLite and "
            f"PostgreSQL); {URL_HINT}"
        )
    return parsed


def sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL, or None for PostgreSQL and in-memory SQLite."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def make_engine(url: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Engine:
    """Create the engine for ``url`` with the connection settings described above.

    Connecting is lazy; ``open_store`` checks reachability right after.
    ``busy_timeout_ms`` (default 5000) only applies to SQLite.
    """
    parsed = normalize_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        # Keepalives turn a silently vanished server into an error instead of a hang.
        connect_args.update(keepalives=1, keepalives_idle=10, keepalives_interval=5,
                            keepalives_count=3)
        kwargs["connect_args"] = connect_args
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ArgumentError, ImportError) as exc:
        raise UserError(
            f"cannot use database '{mask_url_password(url)}' ({exc}); {URL_HINT}"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        _tune_sqlite(engine, busy_timeout_ms)
    return engine


def _tune_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    """Install the connect/begin hooks that give SQLite WAL, waits and real transactions."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module (it never BEGINs before DDL or
        # SELECT); SQLAlchemy's "begin" event below emits BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if engine.url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        if connection.get_execution_options().get(WRITE_OPTION):
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            connection.exec_driver_sql("BEGIN")


def describe_connect_error(url: str, exc: BaseException) -> str:
    """One line saying why ``url`` could not be opened and what to do, password masked."""
    masked = mask_url_password(url)
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = detail[0] if detail else type(exc).__name__
    first = mask_url_password(first)
    path = sqlite_file(url)
    if path is not None and not path.parent.exists():
        return f"cannot open history database '{masked}': folder {path.parent} does not exist; " \
               "create it or pass another --db"
    if path is not None:
        return (f"cannot open history database '{masked}': {first}; the path must be a "
                "writable SQLite file (or not exist yet); fix it or pass another --db")
    return (
        f"cannot open history database '{masked}': {first}; check the URL, that the server is "
        "running and reachable, and the user/password (or pass another --db)"
    )
