"""Errors the history store raises; all are ``UserError`` so the CLI prints one line.

They are user-fixable conditions (a database that went away, a round recorded twice by a
resume that replayed it, a schema from another fedweave version), not programming bugs.
"""

from __future__ import annotations

from fedweave.errors import UserError


class HistoryError(UserError):
    """Base class of every error raised by ``fedweave.history``."""


class DuplicateRoundError(HistoryError):
    """The (run, actor, round) is already recorded; nothing of the second attempt was written."""


class HistoryUnavailableError(HistoryError):
    """The database could not be reached (at open, or for longer than the retry budget)."""


class SchemaMismatchError(HistoryError):
    """The database schema is newer than this code, or older and migration was not allowed."""
