"""studies.began: the last attempt whose driver began running (0: none ever did)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("began", sa.Integer(), nullable=False, server_default="0"))
    # studies stored before: take every attempt as begun, so a retried submit never runs one of them again
    op.execute("UPDATE studies SET began = attempts")


def downgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("began")
