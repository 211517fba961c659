"""Site results may be 'refused' (the site cannot take part in the run, and says why) or
'lost' (the SuperLink lost the site mid-round).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
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
    _status_check(("ok", "failed", "rejected", "late", "refused", "lost"))


def downgrade() -> None:
    op.execute("UPDATE site_results SET status = 'failed' WHERE status = 'refused'")
    op.execute("UPDATE site_results SET status = 'late' WHERE status = 'lost'")
    _status_check(("ok", "failed", "rejected", "late"))
