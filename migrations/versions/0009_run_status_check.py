"""run_status_check: ``runs.status`` holds only a RunStatus (queued, running, completed, failed, cancelled).

PostgreSQL gets the CHECK constraint ``ck_runs_status``. SQLite cannot add a constraint to an existing table
without copying it (and the tables that reference it), so there two triggers refuse an INSERT or an UPDATE of
``status`` with any other value, with the same error class (IntegrityError) and the constraint's name in the
message. The statuses are spelled here, not imported, so that this migration stays what it was when it ran.

Revision ID: 0009
Revises: 0008
Create Date: 2027-03-20
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

CHECK = "status IN ('queued', 'running', 'completed', 'failed', 'cancelled')"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for event in ("INSERT", "UPDATE OF status"):
            name = "ck_runs_status_" + event.split()[0].lower()
            op.execute(
                f"CREATE TRIGGER {name} BEFORE {event} ON runs WHEN NOT (NEW.{CHECK}) "
                "BEGIN SELECT RAISE(ABORT, 'CHECK constraint failed: ck_runs_status'); END"
            )
    else:
        op.create_check_constraint("ck_runs_status", "runs", CHECK)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER ck_runs_status_insert")
        op.execute("DROP TRIGGER ck_runs_status_update")
    else:
        op.drop_constraint("ck_runs_status", "runs", type_="check")
