# PostgreSQL trigger: a rollback request is decided once and then never changes or disappears.
# A pending request may only move to approved or rejected, filling in who decided, when and
# why; every other column stays as it was requested.

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION admission_rollback_request_decide_once() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'admission: rollback requests cannot be deleted'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status <> 'pending' THEN
        RAISE EXCEPTION 'admission: rollback request % was decided (%) and is append-only',
            OLD.id, OLD.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id
        OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id
        OR NEW.target_id IS DISTINCT FROM OLD.target_id
        OR NEW.requested_by_id IS DISTINCT FROM OLD.requested_by_id
        OR NEW.reason IS DISTINCT FROM OLD.reason
        OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'admission: only the decision of rollback request % may be written',
            OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.status = 'pending' OR NEW.decided_by_id IS NULL OR NEW.decided_at IS NULL THEN
        RAISE EXCEPTION 'admission: rollback request % can only be decided', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER admission_rollbackrequest_decide_once
    BEFORE UPDATE OR DELETE ON admission_rollbackrequest
    FOR EACH ROW EXECUTE FUNCTION admission_rollback_request_decide_once();
"""

DROP = """
DROP TRIGGER IF EXISTS admission_rollbackrequest_decide_once ON admission_rollbackrequest;
DROP FUNCTION IF EXISTS admission_rollback_request_decide_once();
"""


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("admission", "0003_workspace_membership_roles")]

    operations = [migrations.RunPython(_create, _drop, elidable=False)]
