"""Schema migrations: from empty, down and up again, refusals, and models == migrations."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from fedweave.history import RoundRecord, SchemaMismatchError, SiteResult, open_store
from fedweave.history.engine import make_engine
from fedweave.history.migrate import current_revision, downgrade, head_revision, upgrade
from fedweave.history.models import SCHEMA_REVISION, Base

TABLES = {"runs", "rounds", "site_results", "checkpoints", "operators", "audit", "submissions"}


def _tables(engine) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names()) - {"alembic_version"}


def _revision(engine) -> str | None:
    with engine.connect() as conn:
        return current_revision(conn)


def test_models_declare_the_newest_migration() -> None:
    assert SCHEMA_REVISION == head_revision()


def test_first_open_creates_the_schema_from_empty(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert _revision(engine) is None and _tables(engine) == set()
        open_store(db_url).close()
        assert _revision(engine) == head_revision()
        assert _tables(engine) == TABLES
    finally:
        engine.dispose()


def test_models_match_the_migrated_schema(db_url: str) -> None:
    open_store(db_url).close()
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(
                conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_downgrade_to_empty_and_upgrade_again(db_url: str) -> None:
    with open_store(db_url) as store:
        run_id = store.start_run("federated", "digits", {}, 1)
    engine = make_engine(db_url)
    try:
        assert downgrade(engine, db_url, "base") == (head_revision(), None)
        assert _tables(engine) == set()
        assert upgrade(engine, db_url) == (None, head_revision())
        assert _tables(engine) == TABLES
        assert upgrade(engine, db_url) == (head_revision(), head_revision())  # idempotent
    finally:
        engine.dispose()
    with open_store(db_url) as store:
        assert store.list_runs() == []  # base dropped the old rows
        new_id = store.start_run("federated", "digits", {}, 1)
        now = datetime.now(timezone.utc)
        store.record_round(new_id, RoundRecord(1, "coordinator", now, now), [SiteResult("a")])
        assert len(store.rounds(new_id)) == 1 and new_id != run_id


def test_an_older_schema_is_refused_without_migrate_then_migrated(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        with pytest.raises(SchemaMismatchError, match="fedweave history migrate"):
            open_store(db_url, migrate=False)
        assert _tables(engine) == set() and _revision(engine) is None  # nothing was written
        open_store(db_url).close()  # migrate=True (the default) moves it forward
        assert _revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_a_newer_schema_is_refused(db_url: str) -> None:
    with open_store(db_url) as store:
        run_id = store.start_run("gossip", "digits", {}, 1)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        for migrate in (True, False):
            with pytest.raises(SchemaMismatchError) as caught:
                open_store(db_url, migrate=migrate)
            assert str(caught.value).startswith(
                f"database schema 9999 is newer than this fedweave ({head_revision()}); "
                "upgrade fedweave")
        with pytest.raises(SchemaMismatchError, match="newer"):
            upgrade(engine, db_url)
        with engine.connect() as conn:  # and nothing was touched
            assert conn.execute(text("SELECT run_id FROM runs")).scalars().all() == [run_id]
    finally:
        engine.dispose()
