"""Site results may be 'late': sampled, but no reply by the round deadline.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CONSTRAINT = "status"  # the naming convention makes it ck_site_results_status


def _status_check(values: tuple[str, ...]) -> None:
    with op.batch_alter_table("site_results") as batch:
        batch.drop_constraint(CONSTRAINT, type_="check")
        batch.create_check_constraint(
            CONSTRAINT, "status IN (" + ", ".join(f"'{v}'" for v in values) + ")"
        )


def upgrade() -> None:
    _status_check(("ok", "failed", "rejected", "late"))


def downgrade() -> None:
    op.execute("UPDATE site_results SET status = 'failed' WHERE status = 'late'")
    _status_check(("ok", "failed", "rejected"))
