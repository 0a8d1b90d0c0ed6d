# Workspace members get a role: the plain many-to-many table becomes the WorkspaceMembership
# model (same table, same rows) with a `role` column. Existing members get the role their
# global permissions used to grant them, so nobody loses or gains an ability by upgrading.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _role_from_global_permissions(apps, schema_editor):
    Membership = apps.get_model("admission", "WorkspaceMembership")
    Permission = apps.get_model("auth", "Permission")

    def holders(codename):
        permission = Permission.objects.filter(
            content_type__app_label="admission", codename=codename
        ).first()
        if permission is None:
            return set()
        direct = set(permission.user_set.values_list("pk", flat=True))
        via_groups = set(
            permission.group_set.values_list("user__pk", flat=True).exclude(user__pk=None)
        )
        return direct | via_groups

    activators = holders("activate_profileversion")
    approvers = holders("approve_profileversion")
    proposers = holders("add_profileversion")
    for membership in Membership.objects.select_related("user"):
        user = membership.user
        if user.is_superuser or (user.is_staff and user.pk in activators):
            role = "operator"
        elif user.is_staff and user.pk in approvers:
            role = "approver"
        elif user.pk in proposers:
            role = "proposer"
        else:
            continue
        Membership.objects.filter(pk=membership.pk).update(role=role)


class Migration(migrations.Migration):
    dependencies = [
        ("admission", "0002_append_only_triggers"),
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="WorkspaceMembership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "workspace",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to="admission.workspace",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="workspace_memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "admission_workspace_members",
                        "ordering": ("workspace", "user"),
                        "unique_together": {("workspace", "user")},
                    },
                ),
                migrations.AlterField(
                    model_name="workspace",
                    name="members",
                    field=models.ManyToManyField(
                        blank=True,
                        related_name="admission_workspaces",
                        through="admission.WorkspaceMembership",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="workspacemembership",
            name="role",
            field=models.CharField(
                choices=[
                    ("viewer", "Viewer: reads the workspace"),
                    ("member", "Member: also submits evaluations"),
                    ("proposer", "Proposer: also proposes profile versions"),
                    ("approver", "Approver: also approves and rejects (others' work only)"),
                    (
                        "operator",
                        "Operator: also activates, requests rollbacks, runs load tests",
                    ),
                ],
                default="member",
                max_length=16,
            ),
        ),
        migrations.RunPython(_role_from_global_permissions, migrations.RunPython.noop),
    ]
