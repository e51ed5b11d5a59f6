"""baselines.broker_kind: a release label is pinned per broker kind.

Pins are read per broker kind (a release run is compared with its own broker's release),
but the unique key was (kind, label): pinning "1.0" for RabbitMQ moved Mosquitto's "1.0"
to the RabbitMQ run, and Mosquitto's release runs lost their baseline without a word.
Release rows take their run's broker kind; reset markers, whose label holds their stage
key, keep "".

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # no view reads baselines: a batch copy of the table (SQLite) is safe here
    with op.batch_alter_table("baselines") as batch:
        batch.add_column(sa.Column("broker_kind", sa.String(), nullable=False,
                                   server_default=""))
    op.execute("UPDATE baselines SET broker_kind = (SELECT runs.broker_kind FROM runs "
               "WHERE runs.run_id = baselines.run_id) WHERE kind = 'release'")
    with op.batch_alter_table("baselines") as batch:
        batch.drop_constraint("uq_baselines_kind_label", type_="unique")
        batch.create_unique_constraint("uq_baselines_kind_broker_kind_label",
                                       ["kind", "broker_kind", "label"])


def downgrade() -> None:
    # a label pinned for two broker kinds keeps its newest pin, as the old key allowed one
    op.execute("DELETE FROM baselines WHERE kind = 'release' AND id NOT IN (SELECT max(id) "
               "FROM baselines WHERE kind = 'release' GROUP BY label)")
    with op.batch_alter_table("baselines") as batch:
        batch.drop_constraint("uq_baselines_kind_broker_kind_label", type_="unique")
        batch.create_unique_constraint("uq_baselines_kind_label", ["kind", "label"])
        batch.drop_column("broker_kind")
