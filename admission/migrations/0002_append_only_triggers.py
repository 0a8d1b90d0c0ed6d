# PostgreSQL triggers: the last line of immutability, below the model and the queryset.

from django.db import migrations

APPEND_ONLY_TABLES = (
    "admission_profileversion",
    "admission_profileapproval",
    "admission_profilechangerecord",
)

CREATE_FUNCTIONS = """
CREATE OR REPLACE FUNCTION admission_refuse_rewrite() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'admission: % on % is refused, rows are append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION admission_approval_proposer_matches() RETURNS trigger AS $$
BEGIN
    IF NEW.proposed_by_id IS DISTINCT FROM (
        SELECT proposed_by_id FROM admission_profileversion WHERE id = NEW.version_id
    ) THEN
        RAISE EXCEPTION 'admission: approval proposer must be the version''s proposer'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS admission_approval_proposer_matches();
DROP FUNCTION IF EXISTS admission_refuse_rewrite();
"""


def _create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE_FUNCTIONS, params=None)
    for table in APPEND_ONLY_TABLES:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION admission_refuse_rewrite();"
        )
    schema_editor.execute(
        "CREATE TRIGGER admission_profileapproval_proposer BEFORE INSERT "
        "ON admission_profileapproval FOR EACH ROW "
        "EXECUTE FUNCTION admission_approval_proposer_matches();"
    )


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DROP TRIGGER IF EXISTS admission_profileapproval_proposer ON admission_profileapproval;"
    )
    for table in APPEND_ONLY_TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};")
    schema_editor.execute(DROP_FUNCTIONS)


class Migration(migrations.Migration):
    dependencies = [("admission", "0001_initial")]

    operations = [migrations.RunPython(_create, _drop, elidable=False)]
