"""The operators of a standing federation and the audit trail of what they did (issue 38).

An operator is a name and the sha256 of a token made for it by ``fedweave operators add``;
the token itself is written once, to a 0600 file for the operator, and stored nowhere else.
A caller is an operator when the sha256 of the token it shows names one that is not removed
(``OperatorRegistry.who``). Adding and removing an operator are audited in the same
transaction; everything the coordinator's operator door does or refuses is audited too
(``OperatorRegistry.record``).

    from fedweave.history import open_store
    from fedweave.history.operators import OperatorRegistry

    with open_store(url) as store:
        operators = OperatorRegistry(store)
        token = operators.add("alice", added_by="root@coordinator")
        assert operators.who(token) == "alice"
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedweave.contract import COMMAND_LINE_OPERATOR
from fedweave.history.models import (
    AUDIT_OUTCOMES,
    DEFAULT_OPERATOR_ROLES,
    OPERATOR_ROLES,
    AuditEntry,
    Operator,
)
from fedweave.history.store import HistoryStore
from fedweave.history.store_errors import HistoryError

TOKEN_PREFIX = "fwop_"
"""Every operator token starts with it, so a token pasted where it does not belong is seen."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
"""An operator's name: a letter or digit, then up to 63 letters, digits, ``. _ @ -``."""
DETAIL_CHARS = 500
"""The longest ``detail`` an audit entry keeps (a refusal's reason, a run's config name)."""


@dataclass(frozen=True)
class OperatorInfo:
    """One operator as ``fedweave operators list`` shows it."""

    name: str
    added_at: datetime
    added_by: str
    removed_at: datetime | None
    roles: frozenset[str] = frozenset(DEFAULT_OPERATOR_ROLES.split(","))

    @property
    def active(self) -> bool:
        return self.removed_at is None

    def may(self, role: str) -> bool:
        """Whether the operator holds ``role`` (``admin`` holds every one)."""
        return role in self.roles or "admin" in self.roles


def check_roles(text: str) -> str:
    """``text`` (comma-separated roles) as stored: known roles only, sorted; ``UserError``."""
    from fedweave.errors import UserError

    roles = sorted({part.strip() for part in text.split(",") if part.strip()})
    unknown = [role for role in roles if role not in OPERATOR_ROLES]
    if unknown or not roles:
        raise UserError(
            (f"unknown operator role {unknown[0]!r}" if unknown else "no operator role given")
            + f"; roles are {', '.join(OPERATOR_ROLES)} (comma-separated)"
        )
    return ",".join(roles)


@dataclass(frozen=True)
class AuditRecord:
    """One audit entry: ``actor`` did (``outcome`` ``done``) or was refused (``refused``)
    ``action`` on ``target``, from ``address`` at ``at``; ``detail`` says more."""

    at: datetime
    actor: str
    address: str | None
    action: str
    target: str | None
    outcome: str
    detail: str | None


def token_sha256(token: str) -> str:
    """The digest the registry keeps of ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    """``name`` if it can name an operator; ``HistoryError`` saying what one looks like."""
    if not NAME_PATTERN.fullmatch(name):
        raise HistoryError(
            f"'{name[:80]}' cannot name an operator: use 1 to 64 letters, digits and . _ @ -, "
            "starting with a letter or digit"
        )
    if name == COMMAND_LINE_OPERATOR:
        raise HistoryError(
            f"'{name}' names the coordinator's own run in the sites' policies; pick another name"
        )
    return name


def _info(row: Operator) -> OperatorInfo:
    return OperatorInfo(
        row.name, row.added_at, row.added_by, row.removed_at, frozenset(row.roles.split(","))
    )


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _entry(
    actor: str,
    action: str,
    outcome: str,
    target: str | None,
    address: str | None,
    detail: str | None,
) -> AuditEntry:
    if outcome not in AUDIT_OUTCOMES:
        raise ValueError(f"outcome must be one of {AUDIT_OUTCOMES}, not {outcome!r}")
    return AuditEntry(
        at=_now(),
        actor=actor[:255],
        address=None if address is None else address[:255],
        action=action[:64],
        target=None if target is None else target[:255],
        outcome=outcome,
        detail=None if detail is None else detail[:DETAIL_CHARS],
    )


class OperatorRegistry:
    """The operators and the audit trail in one history database (``store``'s)."""

    def __init__(self, store: HistoryStore) -> None:
        self._store = store

    def add(self, name: str, added_by: str, roles: str = DEFAULT_OPERATOR_ROLES) -> str:
        """Make operator ``name`` with ``roles`` (comma-separated, ``OPERATOR_ROLES``) and
        return its token (shown once: only its digest is kept). ``HistoryError`` where the
        name is taken, by an operator present or removed (the audit trail keeps naming it)."""
        check_name(name)
        roles = check_roles(roles)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)

        def work(session: Session, _attempt: int) -> None:
            existing = session.get(Operator, name)
            if existing is not None:
                state = "was removed" if existing.removed_at is not None else "exists"
                raise HistoryError(
                    f"operator '{name}' {state} in '{self._store.masked_url}'; "
                    "choose another name (`fedweave operators list` shows them)"
                )
            session.add(
                Operator(
                    name=name,
                    token_sha256=token_sha256(token),
                    added_at=_now(),
                    added_by=added_by[:255],
                    removed_at=None,
                    roles=roles,
                )
            )
            session.add(_entry(added_by, "operator-add", "done", name, None, roles))

        try:
            self._store._write(work)
        except IntegrityError:  # another process added the same name meanwhile
            raise HistoryError(
                f"operator '{name}' exists in '{self._store.masked_url}'; choose another name"
            ) from None
        return token

    def remove(self, name: str, removed_by: str) -> None:
        """Remove operator ``name``: its token is refused from then on. ``HistoryError``
        where there is no such operator, or it was removed already."""

        def work(session: Session, _attempt: int) -> None:
            operator = session.get(Operator, name)
            if operator is None or operator.removed_at is not None:
                raise HistoryError(
                    f"no operator '{name[:80]}' to remove in '{self._store.masked_url}'; "
                    "`fedweave operators list` shows them"
                )
            operator.removed_at = _now()
            session.add(_entry(removed_by, "operator-remove", "done", name, None, None))

        self._store._write(work)

    def set_roles(self, name: str, roles: str, changed_by: str) -> str:
        """Give operator ``name`` exactly ``roles`` (audited); the roles as stored."""
        roles = check_roles(roles)

        def work(session: Session, _attempt: int) -> None:
            operator = session.get(Operator, name)
            if operator is None or operator.removed_at is not None:
                raise HistoryError(
                    f"no operator '{name[:80]}' in '{self._store.masked_url}'; "
                    "`fedweave operators list` shows them"
                )
            operator.roles = roles
            session.add(_entry(changed_by, "operator-roles", "done", name, None, roles))

        self._store._write(work)
        return roles

    def operators(self) -> list[OperatorInfo]:
        """Every operator, present and removed, by name."""
        with self._store._reading() as session:
            rows = session.scalars(select(Operator).order_by(Operator.name)).all()
            return [_info(r) for r in rows]

    def named(self, name: str) -> OperatorInfo | None:
        """The operator of that name, if it is not removed."""
        with self._store._reading() as session:
            row = session.scalars(select(Operator).where(Operator.name == name)).first()
            return _info(row) if row is not None and row.removed_at is None else None

    def holder(self, token: str) -> OperatorInfo | None:
        """The operator ``token`` was made for, if it is not removed; None for any other."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        digest = token_sha256(token)
        with self._store._reading() as session:
            operator = session.scalars(
                select(Operator).where(Operator.token_sha256 == digest)
            ).first()
            if operator is None or operator.removed_at is not None:
                return None
            return _info(operator)

    def who(self, token: str) -> str | None:
        """The name of the operator ``token`` was made for, if it is not removed; None for
        any other token."""
        holder = self.holder(token)
        return holder.name if holder is not None else None

    def record(
        self,
        actor: str,
        action: str,
        outcome: str,
        *,
        target: str | None = None,
        address: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Add one entry to the audit trail (``outcome``: ``done`` or ``refused``)."""
        entry = _entry(actor, action, outcome, target, address, detail)
        self._store._write(lambda session, _attempt: session.add(entry), retry_seconds=5.0)

    def audit(self, limit: int = 50) -> list[AuditRecord]:
        """The newest ``limit`` audit entries, oldest first."""
        with self._store._reading() as session:
            rows = session.scalars(
                select(AuditEntry).order_by(AuditEntry.id.desc()).limit(max(0, limit))
            ).all()
            return [
                AuditRecord(r.at, r.actor, r.address, r.action, r.target, r.outcome, r.detail)
                for r in reversed(rows)
            ]
