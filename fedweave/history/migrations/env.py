"""Alembic environment for the fedweave history schema.

fedweave runs migrations programmatically (``fedweave.history.migrate``) and hands over an
open connection in ``config.attributes["connection"]``, already inside a locked transaction.
Developers can also run ``alembic -c fedweave/history/alembic.ini -x url=sqlite:///x.db ...``
(for example ``revision --autogenerate``); then the URL comes from ``-x url=``.

Writing a migration: keep it in one transaction (no COMMIT inside), use ``op.batch_alter_table``
for SQLite (``render_as_batch`` is on), and remember SQLite connections run with
``PRAGMA foreign_keys=ON``, which cannot change inside a transaction: a batch rebuild of a
referenced table needs ``PRAGMA defer_foreign_keys=ON`` first. Bump ``SCHEMA_REVISION`` in
``models.py`` to the new revision id (a test checks they agree).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from fedweave.history.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Use the caller's connection, or open one from ``-x url=`` / ``sqlalchemy.url``."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from fedweave.history.engine import make_engine

    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("pass the database with: alembic -x url=sqlite:///fedweave.db ...")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
