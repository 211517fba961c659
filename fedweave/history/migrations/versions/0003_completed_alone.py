"""Runs may end 'completed-alone': a gossip peer ran its rounds but mostly without partners.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CONSTRAINT = "status"  # the naming convention makes it ck_runs_status


def _status_check(values: tuple[str, ...]) -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(CONSTRAINT, type_="check")
        batch.create_check_constraint(
            CONSTRAINT, "status IN (" + ", ".join(f"'{v}'" for v in values) + ")"
        )


def upgrade() -> None:
    _status_check(("running", "completed", "completed-alone", "failed", "interrupted"))


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'completed' WHERE status = 'completed-alone'")
    _status_check(("running", "completed", "failed", "interrupted"))
