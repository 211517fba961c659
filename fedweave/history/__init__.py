"""SQL round history that both federated and gossip runs write.

Import cost matters: ``fedweave --help`` imports the CLI, which imports this package, so
SQLAlchemy and Alembic are only loaded when ``open_store`` / ``HistoryStore`` are first used
(module ``__getattr__`` below).

    from fedweave.history import open_store
    store = open_store()            # sqlite:///fedweave.db, migrated on first use

The default database and its environment variable are declared with the ``--db`` option
(``fedweave.config.sections``: ``DEFAULT_DB_URL``, ``DB_URL_ENVVAR``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedweave.history.records import (
    COORDINATOR_ACTOR,
    CheckpointRef,
    RoundInFlight,
    RoundRecord,
    RunInfo,
    SiteResult,
)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from fedweave.history.store import HistoryStore, open_store
    from fedweave.history.store_errors import (
        DuplicateRoundError,
        HistoryError,
        HistoryUnavailableError,
        SchemaMismatchError,
    )

_LAZY = {
    "open_store": "fedweave.history.store",
    "HistoryStore": "fedweave.history.store",
    "HistoryError": "fedweave.history.store_errors",
    "DuplicateRoundError": "fedweave.history.store_errors",
    "HistoryUnavailableError": "fedweave.history.store_errors",
    "SchemaMismatchError": "fedweave.history.store_errors",
}

__all__ = [
    "COORDINATOR_ACTOR",
    "CheckpointRef",
    "DuplicateRoundError",
    "HistoryError",
    "HistoryStore",
    "HistoryUnavailableError",
    "RoundInFlight",
    "RoundRecord",
    "RunInfo",
    "SchemaMismatchError",
    "SiteResult",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """Load the SQLAlchemy-backed parts on first access only."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
