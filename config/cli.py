"""`python -m config.cli run | demo-setup | web | worker | beat`: the newcomer's path to a running
Sluice, and the production processes (web server, Celery worker, Celery beat).

`run` migrates, sets up the demo (idempotent), starts the web server and one Celery worker
process (which runs many evaluations at once on its event loop, evaluator/worker/runner.py),
prints where to go and how to sign in, and stops both on Ctrl-C or SIGTERM. With no
environment it runs on SQLite and the filesystem broker under var/; DATABASE_URL and
CELERY_BROKER_URL switch it to PostgreSQL and Redis (or RabbitMQ), see docs/running.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from config.env import SettingsError, env_bool, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_ADDR = "127.0.0.1:8000"
STOP_GRACE_SECONDS = 15.0
READY_TIMEOUT_SECONDS = 120.0


def _demo_environment(addr: str) -> None:
    """What the demo sets for itself and its children before Django reads the settings: a
    per-deployment secret key under the var dir (unless DJANGO_SECRET_KEY is set), and plain
    HTTP only while it listens on a loopback address."""
    from config.env import secret_key_file_create

    if not os.environ.get("DJANGO_SECRET_KEY"):
        var_dir = Path(os.environ.get("SLUICE_VAR_DIR", BASE_DIR / "var"))
        secret_key_file_create(var_dir / "secret-key")
    if _is_loopback(addr.rsplit(":", 1)[0]):
        os.environ.setdefault("DJANGO_HTTPS", "0")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.conf import settings

    django.setup()
    Path(settings.VAR_DIR).mkdir(parents=True, exist_ok=True)


def _prepare(verbosity: int) -> tuple[Any, Path | None]:
    """Migrate, set up the demo, and keep the passwords of accounts it created in a file only
    the owner can read (the database has digests only). Returns the demo and that file."""
    _setup_django()
    from django.conf import settings
    from django.core.management import call_command

    from config.demo import credentials_file_save, demo_setup

    call_command("migrate", interactive=False, verbosity=verbosity)
    demo = demo_setup()
    return demo, credentials_file_save(demo, Path(settings.VAR_DIR))


def demo_setup_command(args: argparse.Namespace) -> int:
    demo, credentials = _prepare(verbosity=0 if args.json or args.token else 1)
    users = {user.username: user for user in (demo.proposer, demo.approver)}
    if args.token:
        if args.token not in users:
            names = " or ".join(users)
            print(f"error: --token takes a demo user, {names}; got {args.token!r}", file=sys.stderr)
            return 2
        print(users[args.token].token)
    elif args.json:
        print(json.dumps(demo.as_dict() | {"credentialsFile": _shown_path(credentials)}))
    else:
        _print_credentials(demo, credentials)
    return 0


def _shown_path(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _print_credentials(demo: Any, credentials: Path | None = None) -> None:
    print(f"Demo workspace {demo.workspace!r}, active profile {demo.profile_version!r}.")
    for user in (demo.proposer, demo.approver):
        kept = "(in the file below)" if credentials is not None else "(shown once, when created)"
        password = user.password or kept
        print(f"  user {user.username:<14} password {password:<20} API token {user.token}")
    if credentials is not None:
        print(f"  The passwords are kept in {_shown_path(credentials)} (readable by you only).")
    elif demo.proposer.password is None:
        print(
            "  Passwords are shown only when the accounts are created; "
            "`manage.py changepassword NAME` sets a new one."
        )


def _banner(
    demo: Any,
    addr: str,
    broker: str,
    database: str,
    *,
    show_credentials: bool,
    credentials: Path | None = None,
) -> None:
    """Where Sluice runs and how to try it; passwords and tokens only when `show_credentials`,
    else where the passwords are kept and how to get a token."""
    base = f"http://{addr}"
    evaluations = f"{base}/api/workspaces/{demo.workspace}/evaluations/"
    lines = [
        "",
        "Sluice is running.",
        f"  admin      {base}/admin/",
        f"  API docs   {base}/api/docs/",
        f"  database   {database}",
        f"  broker     {broker}",
        "",
    ]
    print("\n".join(lines))
    user = demo.proposer.username
    # An absolute path, so the lines work from any directory; -S shows curl's own errors.
    document = shlex.quote(f"@{BASE_DIR / 'docs' / 'example-evaluation.json'}")
    setup = (
        f"cd {shlex.quote(str(BASE_DIR))} && {shlex.quote(sys.executable)} -m config.cli demo-setup"
    )
    if show_credentials:
        _print_credentials(demo, credentials)
        token = demo.proposer.token
        how = f"with {user}'s API token"
        fetch = ""
    else:
        kept = (
            f"The demo passwords are in {_shown_path(credentials)} (readable by you only).\n"
            if credentials is not None
            else ""
        )
        print(
            f"Demo credentials are not printed: the server listens on {addr}, not on the default "
            f"{DEFAULT_ADDR}.\n{kept}Show them with SLUICE_SHOW_CREDENTIALS=1 "
            f"(or --show-credentials), or run: {setup}"
        )
        token = "$TOKEN"
        how = f"TOKEN is {user}'s API token; the first line issues a new one"
        fetch = f"  TOKEN=$({setup} --token {user})\n"
    print(
        f"\nRun an evaluation as {user} ({how}; docs/quick-tour.md explains the document):\n"
        f"{fetch}"
        f"  curl -sS -H \"Authorization: Token {token}\" -H 'Content-Type: application/json' \\\n"
        f"    -d {document} {evaluations}\n"
        "\nPress Ctrl-C to stop the web server and the worker.\n",
        flush=True,
    )


def _die_with_parent() -> None:
    # A child must not outlive a launcher that was killed without a chance to stop it.
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


class Supervisor:
    """Starts child processes, and stops them all: SIGTERM first, SIGKILL after a grace period."""

    def __init__(self) -> None:
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def start(self, name: str, argv: list[str]) -> None:
        # A group of its own: Ctrl-C reaches the launcher alone, which stops children in order.
        self.children[name] = subprocess.Popen(
            argv, cwd=BASE_DIR, process_group=0, preexec_fn=_die_with_parent
        )

    def exited(self) -> str | None:
        for name, child in self.children.items():
            if child.poll() is not None:
                return name
        return None

    def stop(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in self.children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _wait_ready(url: str, supervisor: Supervisor) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline and not supervisor.stopping:
        if supervisor.exited() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    return False


def run_command(args: argparse.Namespace) -> int:
    demo, credentials = _prepare(verbosity=1)
    from django.conf import settings

    database = f"{str(settings.DATABASES['default']['ENGINE']).rsplit('.', 1)[-1]} " + str(
        settings.DATABASES["default"]["NAME"]
    )
    broker = str(settings.CELERY_BROKER_URL).split("@")[-1]
    supervisor = Supervisor()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    python = sys.executable
    # The demo's web server is the production one (`web`), bound to the demo address.
    supervisor.start("web", [python, "-m", "config.cli", "web", "--bind", args.addr])
    # And its worker is the production one (`worker`).
    worker = ["worker", "--concurrency", str(args.concurrency)]
    supervisor.start(
        "worker", [python, "-m", "config.cli", *worker, "--hostname", f"sluice-{os.getpid()}@%h"]
    )
    status = 0
    try:
        if _wait_ready(f"http://{args.addr}/readyz", supervisor):
            show = args.show_credentials or args.addr == DEFAULT_ADDR
            _banner(
                demo,
                args.addr,
                broker,
                database,
                show_credentials=show,
                credentials=credentials,
            )
        while not supervisor.stopping:
            name = supervisor.exited()
            if name is not None:
                print(f"The {name} process exited; stopping.", file=sys.stderr)
                status = 1
                break
            time.sleep(0.2)
    finally:
        print("Stopping the web server and the worker…", flush=True)
        supervisor.stop()
    print("Stopped.", flush=True)
    return status


def web_command(args: argparse.Namespace) -> int:
    """Collect static files (unless told not to) and serve the site with gunicorn."""
    _setup_django()
    from django.conf import settings
    from django.core.management import call_command

    from config.web import SluiceWebServer, web_options

    if not args.no_collectstatic:
        call_command("collectstatic", interactive=False, verbosity=0)
    options = web_options(settings, bind=args.bind, workers=args.workers, timeout=args.timeout)
    SluiceWebServer(options).run()
    return 0


def _add_web_command(commands: Any) -> None:
    web = commands.add_parser(
        "web", help="serve the site with gunicorn (production); see docs/deploying.md"
    )
    web.add_argument("--bind", help="host:port or unix:/path (default SLUICE_WEB_BIND)")
    web.add_argument("--workers", type=int, help="worker processes (default SLUICE_WEB_WORKERS)")
    web.add_argument("--timeout", type=int, help="request timeout, s (default SLUICE_WEB_TIMEOUT)")
    web.add_argument(
        "--no-collectstatic",
        action="store_true",
        help="serve what STATIC_ROOT holds; the deployment ran collectstatic already",
    )
    web.set_defaults(handler=web_command)


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The Celery worker's command line that `worker` runs (and `run` starts for the demo)."""
    # One process: Celery's threads carry doorbells; its runner runs evaluations and load runs
    # (SLUICE_WORKER_SLOTS at once) on one event loop (evaluator/worker/runner.py).
    argv = ["worker", "--loglevel", args.loglevel, "--pool", "threads"]
    argv += ["--concurrency", str(args.concurrency)]
    argv += ["--without-gossip", "--without-mingle", "--hostname", args.hostname]
    return argv


def worker_command(args: argparse.Namespace) -> int:
    """Run a Celery worker in the foreground; SIGTERM stops it after its tasks (warm shutdown)."""
    _setup_django()
    from config.celery import app

    app.worker_main(worker_argv(args))
    return 0


def beat_command(args: argparse.Namespace) -> int:
    """Run Celery beat in the foreground: the deployment's periodic tasks, once per deployment."""
    _setup_django()
    from django.conf import settings

    from config.celery import app

    schedule = args.schedule or str(Path(settings.VAR_DIR) / "celerybeat-schedule")
    app.start(["beat", "--loglevel", args.loglevel, "--schedule", schedule])
    return 0


def _add_worker_commands(commands: Any) -> None:
    try:
        concurrency = env_int("SLUICE_WORKER_CONCURRENCY", 4, minimum=1)
        loglevel = env_str("SLUICE_LOG_LEVEL", "") or "INFO"
    except SettingsError as error:
        raise SystemExit(f"error: {error}") from None
    worker = commands.add_parser(
        "worker", help="run a Celery worker (evaluations, load runs); see docs/deploying.md"
    )
    worker.add_argument(
        "--concurrency",
        type=int,
        default=concurrency,
        help="Celery threads for doorbells (default SLUICE_WORKER_CONCURRENCY, "
        "4); evaluations run on the process's event loop, SLUICE_WORKER_SLOTS at once",
    )
    worker.add_argument(
        "--hostname",
        default="sluice@%h",
        help="node name, unique per worker on a host (default sluice@%%h)",
    )
    worker.add_argument("--loglevel", default=loglevel, help="default SLUICE_LOG_LEVEL, INFO")
    worker.set_defaults(handler=worker_command)
    beat = commands.add_parser(
        "beat", help="run Celery beat, the periodic tasks (one per deployment)"
    )
    beat.add_argument(
        "--schedule", help="beat's state file (default $SLUICE_VAR_DIR/celerybeat-schedule)"
    )
    beat.add_argument("--loglevel", default=loglevel, help="default SLUICE_LOG_LEVEL, INFO")
    beat.set_defaults(handler=beat_command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.cli", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="migrate, set up the demo, run web server and worker")
    try:
        addr = env_str("SLUICE_ADDR", "") or DEFAULT_ADDR
        concurrency = env_int("SLUICE_WORKER_CONCURRENCY", 4, minimum=1)
        show_credentials = env_bool("SLUICE_SHOW_CREDENTIALS", False)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run.add_argument("--addr", default=addr)
    run.add_argument(
        "--concurrency",
        type=int,
        default=concurrency,
        help="the worker's Celery threads (default 4); evaluations run SLUICE_WORKER_SLOTS at once",
    )
    run.add_argument(
        "--show-credentials",
        action="store_true",
        default=show_credentials,
        help="print the demo passwords and tokens even when --addr is not the default "
        "(also SLUICE_SHOW_CREDENTIALS=1)",
    )
    run.set_defaults(handler=run_command)
    setup = commands.add_parser("demo-setup", help="migrate and set up the demo, idempotently")
    setup.add_argument("--json", action="store_true", help="print the credentials as JSON")
    setup.add_argument(
        "--token", metavar="USER", help="print only a new API token of this demo user"
    )
    setup.add_argument("--addr", default=addr)
    setup.set_defaults(handler=demo_setup_command)
    _add_web_command(commands)
    _add_worker_commands(commands)
    args = parser.parse_args(argv)
    if args.command in ("run", "demo-setup"):
        # Only the demo makes its own key and plain-HTTP allowance; `web` is production's.
        _demo_environment(args.addr)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
