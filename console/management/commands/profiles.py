"""`manage.py profiles`: the profile workflow from a shell, through the same services.

Every subcommand acts as `--user`, and only once that user proved who they are: with their API
token (`SLUICE_PROFILES_TOKEN`) or password (`SLUICE_PROFILES_PASSWORD`) from the environment,
or typed at a prompt when the command runs in a terminal. The services then apply the same
workspace roles (`admission.access`) and four-eyes rules as the admin and the API.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.signals import user_logged_in
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.http import HttpRequest
from rest_framework.exceptions import AuthenticationFailed

from admission import access, selectors
from admission.models import RUNBOOK_ID, ProfileVersion, RollbackRequest, Workspace
from admission.services import profiles as services
from admission.services import rollout
from console.api.auth import ApiTokenAuthentication
from console.api.untrusted_json import UntrustedJSONError, check_json_value, load_untrusted_json
from console.management.refusals import REFUSALS, command_error
from evaluator import comparisons, qualification
from evaluator.services.runs import load_run_submit
from evaluator.worker.load_dispatch import load_run_execute

CHECKLIST_IDS = [key for key, _ in services.RUNBOOK_CHECKLIST]
TOKEN_VARIABLE = "SLUICE_PROFILES_TOKEN"
PASSWORD_VARIABLE = "SLUICE_PROFILES_PASSWORD"


class Command(BaseCommand):
    help = (
        "Propose, approve, reject, activate and roll back admission profile versions, run "
        "what-if qualification on them, turn the kill switch, run shadows and canaries, and "
        "list versions and their change history."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare every subcommand and its options in one place (one block per subcommand, so
        `--help` and this read in the same order; long only because the command has many)."""
        commands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

        propose = commands.add_parser("propose", help="Propose a profile document.")
        _workspace_and_user(propose)
        propose.add_argument("--file", required=True, help="Path to the profile JSON document.")

        approve = commands.add_parser("approve", help=f"Approve a version under {RUNBOOK_ID}.")
        _version_and_user(approve)
        approve.add_argument(
            "--confirm",
            action="append",
            default=[],
            metavar="CHECK",
            help=f"A confirmed checklist item ({', '.join(CHECKLIST_IDS)}); repeat per item.",
        )
        approve.add_argument(
            "--confirm-all",
            action="store_true",
            help="Confirm every checklist item of the runbook.",
        )
        approve.add_argument("--comment", default="")

        reject = commands.add_parser("reject", help="Reject a version.")
        _version_and_user(reject)
        reject.add_argument("--comment", required=True, help="Why it is rejected.")

        activate = commands.add_parser("activate", help="Activate an approved version.")
        _version_and_user(activate)

        rollback = commands.add_parser("rollback", help="Request or decide a rollback.")
        steps = rollback.add_subparsers(dest="step", required=True, metavar="STEP")
        request = steps.add_parser("request", help="Ask to activate an earlier version again.")
        _version_and_user(request)
        request.add_argument("--reason", default="")
        for name, needs_comment in (("approve", False), ("reject", True)):
            decide = steps.add_parser(name, help=f"{name.capitalize()} the pending rollback.")
            _workspace_and_user(decide)
            decide.add_argument("--comment", required=needs_comment, default="")

        listing = commands.add_parser("list", help="List a workspace's versions.")
        _workspace_and_user(listing)

        what_if = commands.add_parser(
            "what-if",
            help="Run the offline manifest against a version's limits and keep the what-if "
            "record beside it (it never counts as load evidence).",
        )
        what_if.add_argument("label", metavar="LABEL", help="The profileVersion.")
        _workspace_and_user(what_if)
        what_if.add_argument("--manifest", default="load-manifest.v2.json", metavar="NAME")
        what_if.add_argument(
            "--target", default="admission-controller", choices=qualification.WHAT_IF_TARGETS
        )
        for section in ("principal", "provider"):
            what_if.add_argument(
                f"--map-{section}",
                action="append",
                default=[],
                metavar="MANIFEST_ID=PROFILE_ID",
                help=f"Map a manifest {section} onto one of the version's; repeat per id.",
            )
        what_if.add_argument("--json", action="store_true", help="Print the whole record.")
        what_if.add_argument(
            "--wait",
            type=float,
            default=600.0,
            metavar="SECONDS",
            help="How long to wait for the run's turn and its end (default 600).",
        )

        switch = commands.add_parser(
            "switch",
            help="The kill switch: turn bounded parallel scheduling off (--off, with a reason) "
            "or allow it again (--on), from the next run on.",
        )
        _workspace_and_user(switch)
        position = switch.add_mutually_exclusive_group(required=True)
        position.add_argument("--off", action="store_true", help="Serial, one permit.")
        position.add_argument("--on", action="store_true", help="Allowed again.")
        switch.add_argument("--reason", default="")

        for kind in ("shadow", "canary"):
            control = commands.add_parser(kind, help=f"Start, show or end the workspace's {kind}.")
            steps = control.add_subparsers(dest="step", required=True, metavar="STEP")
            start = steps.add_parser("start", help=f"Start an approved version as the {kind}.")
            _version_and_user(start)
            start.add_argument("--reason", default="")
            if kind == "canary":
                start.add_argument(
                    "--principal",
                    action="append",
                    default=[],
                    metavar="ID",
                    help="A principal whose runs all use the canary; repeat per principal.",
                )
                start.add_argument(
                    "--fraction",
                    type=float,
                    default=None,
                    help="A share of the other runs in (0, 1), chosen by invocation id.",
                )
            show = steps.add_parser("show", help=f"The running {kind} and its comparison.")
            _workspace_and_user(show)
            show.add_argument("--json", action="store_true", help="Print the comparison as JSON.")
            ends = ("stop",) if kind == "shadow" else ("promote", "abandon")
            for end in ends:
                closing = steps.add_parser(end, help=f"{end.capitalize()} the {kind}.")
                _workspace_and_user(closing)
                closing.add_argument("--reason", default="")

        history = commands.add_parser("history", help="Show a workspace's change records.")
        _workspace_and_user(history)
        history.add_argument("--kind", choices=["initial", "change", "rollback"])
        history.add_argument("--json", action="store_true", help="One JSON record per line.")

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options["subcommand"].replace("-", "_")
        if subcommand in ("rollback", "shadow", "canary"):
            subcommand = f"{subcommand}_{options['step']}"
        for name in ("comment", "reason"):
            if options.get(name):
                _check_text(options[name], f"--{name}")
        options["actor"] = _authenticated(options["user"])
        try:
            getattr(self, f"_{subcommand}")(options)
        except REFUSALS as error:
            raise command_error(error, user=options["user"]) from error

    def _propose(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        user = options["actor"]
        document = _read_document(options["file"])
        try:
            version = services.profile_version_propose(
                workspace=workspace, document=document, proposed_by=user
            )
        except services.ProfileVersionDuplicate as duplicate:
            self.stdout.write(f"{duplicate.version} was already proposed with these limits.")
            return
        self.stdout.write(self.style.SUCCESS(f"Proposed {version} ({version.profile_digest})."))

    def _approve(self, options: dict[str, Any]) -> None:
        unknown = sorted(set(options["confirm"]) - set(CHECKLIST_IDS))
        if unknown:
            raise CommandError(
                f"unknown checklist item(s) {', '.join(unknown)}; "
                f"the items are {', '.join(CHECKLIST_IDS)}"
            )
        confirmed = CHECKLIST_IDS if options["confirm_all"] else options["confirm"]
        version = _version(options["workspace"], options["version"])
        services.profile_version_approve(
            version=version,
            approver=options["actor"],
            checklist={key: key in confirmed for key in CHECKLIST_IDS},
            comment=options["comment"],
        )
        self.stdout.write(self.style.SUCCESS(f"Approved {version}."))

    def _reject(self, options: dict[str, Any]) -> None:
        version = _version(options["workspace"], options["version"])
        services.profile_version_reject(
            version=version, approver=options["actor"], comment=options["comment"]
        )
        self.stdout.write(self.style.SUCCESS(f"Rejected {version}."))

    def _activate(self, options: dict[str, Any]) -> None:
        version = _version(options["workspace"], options["version"])
        record = services.profile_version_activate(version=version, actor=options["actor"])
        self.stdout.write(self.style.SUCCESS(_describe(record)))

    def _rollback_request(self, options: dict[str, Any]) -> None:
        version = _version(options["workspace"], options["version"])
        services.rollback_request_create(
            workspace=version.workspace,
            target=version,
            requested_by=options["actor"],
            reason=options["reason"],
        )
        self.stdout.write(
            self.style.SUCCESS(f"Requested a rollback to {version}; a second operator approves it.")
        )

    def _rollback_approve(self, options: dict[str, Any]) -> None:
        request = _pending_rollback(options["workspace"])
        record = services.rollback_request_approve(
            request=request, approver=options["actor"], comment=options["comment"]
        )
        self.stdout.write(self.style.SUCCESS(_describe(record)))

    def _rollback_reject(self, options: dict[str, Any]) -> None:
        request = _pending_rollback(options["workspace"])
        services.rollback_request_reject(
            request=request, approver=options["actor"], comment=options["comment"]
        )
        self.stdout.write(self.style.SUCCESS(f"Rejected the rollback to {request.target}."))

    def _switch(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        allowed = bool(options["on"])
        rollout.parallel_scheduling_set(
            workspace=workspace, actor=options["actor"], allowed=allowed, reason=options["reason"]
        )
        state = "allowed" if allowed else "off: runs that start from now on are serial"
        self.stdout.write(self.style.SUCCESS(f"Parallel scheduling in {workspace.key}: {state}."))

    def _shadow_start(self, options: dict[str, Any]) -> None:
        version = _version(options["workspace"], options["version"])
        rollout.shadow_start(version=version, actor=options["actor"], reason=options["reason"])
        self.stdout.write(self.style.SUCCESS(f"Started {version} as the shadow."))

    def _shadow_stop(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        rollout.shadow_stop(workspace=workspace, actor=options["actor"], reason=options["reason"])
        self.stdout.write(self.style.SUCCESS(f"Stopped the shadow of {workspace.key}."))

    def _canary_start(self, options: dict[str, Any]) -> None:
        version = _version(options["workspace"], options["version"])
        rollout.canary_start(
            version=version,
            actor=options["actor"],
            principals=options["principal"],
            fraction=options["fraction"],
            reason=options["reason"],
        )
        self.stdout.write(self.style.SUCCESS(f"Started {version} as a canary."))

    def _canary_promote(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        _event, record = rollout.canary_promote(
            workspace=workspace, actor=options["actor"], reason=options["reason"]
        )
        self.stdout.write(self.style.SUCCESS(_describe(record)))

    def _canary_abandon(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        rollout.canary_abandon(
            workspace=workspace, actor=options["actor"], reason=options["reason"]
        )
        self.stdout.write(self.style.SUCCESS(f"Abandoned the canary of {workspace.key}."))

    def _shadow_show(self, options: dict[str, Any]) -> None:
        self._show(options, "shadow")

    def _canary_show(self, options: dict[str, Any]) -> None:
        self._show(options, "canary")

    def _show(self, options: dict[str, Any], kind: str) -> None:
        workspace = _workspace(options["workspace"])
        access.require(options["actor"], access.VIEW, workspace)
        running = (
            rollout.shadow_current(workspace=workspace)
            if kind == "shadow"
            else rollout.canary_current(workspace=workspace)
        )
        if running is None or running.version is None:
            raise CommandError(f"workspace {workspace.key!r} has no running {kind}")
        comparison = comparisons.session_comparison(running)
        if options["json"]:
            self.stdout.write(json.dumps(comparison.to_dict(), sort_keys=True))
            return
        self.stdout.write(
            f"{kind} {running.version.profile_version} since {running.at:%Y-%m-%d %H:%M:%S} UTC, "
            f"{comparison.observations} run(s) observed"
        )
        for bound in comparison.bounds:
            mark = "pass" if bound.passed else "FAIL"
            self.stdout.write(f"  {mark}  {bound.title}: {bound.verdict}")

    def _list(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        access.require(options["actor"], access.VIEW, workspace)
        for version in selectors.profile_version_list(workspace=workspace):
            self.stdout.write(
                f"{version.profile_version}\t{selectors.version_status(version)}\t"
                f"{version.profile_digest}\t{version.proposed_by}\t{version.created_at.isoformat()}"
            )

    def _what_if(self, options: dict[str, Any]) -> None:
        version = _version(options["workspace"], options["label"])
        mapping = {
            "principals": _pairs(options["map_principal"], "--map-principal"),
            "providers": _pairs(options["map_provider"], "--map-provider"),
        }
        run = load_run_submit(
            version.workspace,
            options["actor"],
            options["manifest"],
            options["target"],
            what_if_version=version,
            mapping={key: pairs for key, pairs in mapping.items() if pairs} or None,
        )
        # The operator waits for the verdict: the run goes here once it is its turn (the same
        # per-workspace cap and order as on a worker), unless a worker takes it first.
        done = load_run_execute(run.pk, wait_seconds=options["wait"])
        assert done is not None
        if not done.finished:
            raise CommandError(
                f"load run {done.pk} is still {done.status} after {options['wait']:g} s (other "
                "load runs of the workspace go first); it stays queued, see it in the admin"
            )
        if done.record is None:
            detail = (done.error or {}).get("detail") or done.status
            raise CommandError(f"the what-if run did not complete: {detail}")
        if options["json"]:
            self.stdout.write(json.dumps(done.record, indent=2, ensure_ascii=False))
            return
        record = done.record
        verdict = "passes every bound" if record["passed"] else "FAILS"
        self.stdout.write(
            f"What-if {version} on {done.manifest_name} → {done.target}: {verdict} "
            f"(kept as load run {done.pk})."
        )
        for section, pairs in record["whatIf"]["mapping"].items():
            shown = ", ".join(f"{source} → {target}" for source, target in pairs.items())
            self.stdout.write(f"  {section}: {shown}")
        for comparison in record["comparisons"]:
            mark = "pass" if comparison["pass"] else "FAIL"
            self.stdout.write(
                f"  {mark}  {comparison['bound']}: observed {comparison['observed']}, "
                f"limit {comparison['limit']}"
            )

    def _history(self, options: dict[str, Any]) -> None:
        workspace = _workspace(options["workspace"])
        access.require(options["actor"], access.VIEW, workspace)
        records = selectors.profile_history_list(workspace=workspace, kind=options["kind"])
        for record in records.order_by("at", "id"):
            if options["json"]:
                self.stdout.write(json.dumps(record.to_dict(), sort_keys=True))
            else:
                reason = record.rollback_request.reason if record.rollback_request else ""
                self.stdout.write(
                    f"{record.at.isoformat()}\t{record.kind}\t"
                    f"{record.previous_profile_version or '-'} -> {record.profile_version}\t"
                    f"{record.digest}\t{record.actor}" + (f"\t{reason}" if reason else "")
                )


def _workspace_and_user(parser: CommandParser) -> None:
    parser.add_argument("--workspace", required=True, metavar="KEY")
    parser.add_argument(
        "--user",
        required=True,
        metavar="NAME",
        help=f"Who does it; proven by {TOKEN_VARIABLE}, {PASSWORD_VARIABLE} or a prompt.",
    )


def _version_and_user(parser: CommandParser) -> None:
    _workspace_and_user(parser)
    parser.add_argument("--version", required=True, metavar="LABEL", help="The profileVersion.")


def _pairs(given: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in given:
        source, sep, target = item.partition("=")
        if not sep or not source or not target:
            raise CommandError(f"{option} takes MANIFEST_ID=PROFILE_ID, got {item!r}")
        pairs[source] = target
    return pairs


def _workspace(key: str) -> Workspace:
    workspace = selectors.workspace_get(key=key)
    if workspace is None:
        raise CommandError(f"unknown workspace {key!r}")
    return workspace


def _version(workspace_key: str, label: str) -> ProfileVersion:
    version = selectors.profile_version_get(workspace=_workspace(workspace_key), label=label)
    if version is None:
        raise CommandError(f"workspace {workspace_key!r} has no profile version {label!r}")
    return version


def _pending_rollback(workspace_key: str) -> RollbackRequest:
    request = selectors.rollback_request_pending(workspace=_workspace(workspace_key))
    if request is None:
        raise CommandError(f"workspace {workspace_key!r} has no pending rollback request")
    return request


def _authenticated(username: str) -> Any:
    """The user named `username`, once their token or password checked out."""
    # A credential for this one invocation, like an argument: not a deployment setting.
    token = os.environ.get(TOKEN_VARIABLE, "")
    password = os.environ.get(PASSWORD_VARIABLE, "")
    if not token and not password:
        if not sys.stdin.isatty():
            raise CommandError(
                f"prove who {username} is: set {TOKEN_VARIABLE} (their API token) or "
                f"{PASSWORD_VARIABLE}, or run the command in a terminal to be asked"
            )
        secret = getpass.getpass(f"API token or password of {username}: ")
        token = password = secret
    user = _by_token(token) if token else None
    if user is None or user.get_username() != username:
        user = _by_password(username, password) if password else None
    if user is _LOCKED_OUT:
        raise CommandError(
            f"{username} is locked out after too many failed sign-ins; try again after the "
            "cool-off (SLUICE_LOGIN_COOLOFF_MINUTES)"
        )
    if user is None:
        raise CommandError(
            f"could not verify that you are {username}: wrong or expired credentials"
        )
    return user


def _by_token(token: str) -> Any:
    try:
        user, _ = ApiTokenAuthentication().authenticate_credentials(token.encode("utf-8"))
    except (AuthenticationFailed, UnicodeEncodeError):
        return None
    return user


_LOCKED_OUT = object()
# A shell's sign-in counts toward the lockout as one from this machine would.
SHELL_ADDRESS = "127.0.0.1"


def _by_password(username: str, password: str) -> Any:
    # Through the authentication backends, so a wrong password counts toward the sign-in
    # lockout (django-axes) like one at the admin's login, and a locked-out user is refused.
    request = HttpRequest()
    request.method = "POST"
    request.path = "/manage.py/profiles"
    request.META["REMOTE_ADDR"] = SHELL_ADDRESS
    user = authenticate(request, username=username, password=password)
    if getattr(request, "axes_locked_out", False):
        return _LOCKED_OUT
    if user is not None:
        # A sign-in as the admin's: it resets the failure count (and notes the last login).
        user_logged_in.send(sender=user.__class__, request=request, user=user)
    return user


def _check_text(value: str, option: str) -> None:
    try:
        check_json_value(value, option)
    except UntrustedJSONError as error:
        raise CommandError(str(error)) from None


def _read_document(path: str) -> Any:
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as missing:
        raise CommandError(f"no such file: {path}") from missing
    except (OSError, UnicodeDecodeError) as unreadable:
        raise CommandError(f"cannot read {path}: {unreadable}") from unreadable
    try:
        return load_untrusted_json(text, max_depth=settings.SLUICE_MAX_JSON_DEPTH)
    except UntrustedJSONError as error:
        raise CommandError(f"{path}: {error}") from None


def _describe(record: Any) -> str:
    previous = record.previous_profile_version or "nothing"
    return (
        f"Activated {record.profile_version} in {record.workspace.key} "
        f"({record.kind}, previously {previous}; digest {record.digest})."
    )
