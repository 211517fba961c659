"""Operators' roles at the door: submit, read own or all, stop own or all, admin (issue 72).
Existing operators get their own studies only.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("operators") as batch:
        batch.add_column(
            sa.Column(
                "roles", sa.String(255), nullable=False,
                server_default="submit,read-own,stop-own",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("operators") as batch:
        batch.drop_column("roles")
