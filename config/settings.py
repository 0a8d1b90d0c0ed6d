"""Django settings: embedded defaults (SQLite, filesystem broker), overridden by the environment."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from config.csp import DEFAULT_POLICY
from config.env import (
    SettingsError,
    cache_from_url,
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_json,
    env_list,
    env_networks,
    env_rate,
    env_str,
    otlp_protocol,
    secret_key_from_environment,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("SLUICE_VAR_DIR", "") or BASE_DIR / "var")

# Off unless asked for: a debug page shows code and a debug 404 lists every route.
DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY_FILE = VAR_DIR / "secret-key"
SECRET_KEY = secret_key_from_environment(debug=DEBUG, key_file=SECRET_KEY_FILE)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# HTTPS everywhere unless DEBUG is on or a loopback deployment turns it off (DJANGO_HTTPS=0).
HTTPS = env_bool("DJANGO_HTTPS", not DEBUG)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)
if env_bool("SLUICE_BEHIND_TLS_PROXY", False):
    # Only behind a proxy that sets X-Forwarded-Proto itself and strips what clients send.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_AGE = env_int("SLUICE_SESSION_SECONDS", 8 * 3600, minimum=60)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Scripts from this origin only (config/csp.py); the variable replaces the whole policy.
SLUICE_CONTENT_SECURITY_POLICY = env_str("SLUICE_CONTENT_SECURITY_POLICY", "") or DEFAULT_POLICY

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "axes",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    "console",
    "admission",
    "evaluator",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # First, so a locked-out username and address never reach the password check.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"

_database_url = env_str("DATABASE_URL", "")
if _database_url:
    DATABASES = {"default": database_from_url(_database_url, BASE_DIR)}
else:
    # The embedded database lives in the var dir, which a fresh checkout does not have yet.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "sluice.sqlite3"),
            # IMMEDIATE: a read-then-write transaction waits for the lock instead of failing.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Admin sign-in lockout (django-axes): this many failures for one username from one address
# lock that pair out for the cool-off period; a success resets the count.
AXES_FAILURE_LIMIT = env_int("SLUICE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = dt.timedelta(minutes=env_int("SLUICE_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

LOGIN_URL = "/admin/login/"

# Request bodies: one bound for every body, and a cap per API endpoint at what it needs (the API's
# JSON parser, console/api/parsers.py); the parser also bounds nesting depth in linear time.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("SLUICE_MAX_REQUEST_BYTES", 1_048_576, minimum=1024)
SLUICE_MAX_JSON_DEPTH = env_int("SLUICE_MAX_JSON_DEPTH", 64, minimum=4)
# Approvals, rejections, cancels, load-run starts, token requests: a comment and a few names.
SLUICE_MAX_ACTION_REQUEST_BYTES = env_int("SLUICE_MAX_ACTION_REQUEST_BYTES", 65_536, minimum=1024)
# A proposed profile document: its size as compact JSON and the principals it names; and the
# versions one workspace may keep awaiting approval or rejection.
SLUICE_MAX_PROFILE_BYTES = env_int("SLUICE_MAX_PROFILE_BYTES", 262_144, minimum=1024)
SLUICE_MAX_PROFILE_PRINCIPALS = env_int("SLUICE_MAX_PROFILE_PRINCIPALS", 1000, minimum=1)
SLUICE_MAX_PENDING_VERSIONS = env_int("SLUICE_MAX_PENDING_VERSIONS", 20, minimum=1)
# A profile proposal's body: the document as sent (indented, escaped) plus its envelope.
SLUICE_MAX_PROFILE_REQUEST_BYTES = 2 * SLUICE_MAX_PROFILE_BYTES + 65_536
# An evaluation's body (ruleset and input) may use the whole SLUICE_MAX_REQUEST_BYTES.
SLUICE_MAX_EVALUATION_REQUEST_BYTES = DATA_UPLOAD_MAX_MEMORY_SIZE

# No settings, environment or local variables on any error page, DEBUG or not.
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.error_reports.RedactingReporterFilter"

# The cache holds API throttle counters, so every process must share it: Redis whenever the
# deployment has one (SLUICE_CACHE_URL, else a redis:// broker), local memory otherwise.
_cache_url = os.environ.get("SLUICE_CACHE_URL", "")
if not _cache_url and os.environ.get("CELERY_BROKER_URL", "").startswith(("redis://", "rediss://")):
    _cache_url = os.environ["CELERY_BROKER_URL"]
CACHES = {
    "default": cache_from_url(
        _cache_url or "locmem://",
        key_prefix=os.environ.get("SLUICE_CACHE_KEY_PREFIX", "sluice"),
    )
}

# API throttles (requests per period; `off` disables one): per user, per workspace, and a
# stricter per-user scope for POSTs that start evaluations and load runs.
SLUICE_THROTTLE_RATES = {
    "anon": env_rate("SLUICE_THROTTLE_ANON", "60/minute"),
    "user": env_rate("SLUICE_THROTTLE_USER", "1200/minute"),
    "workspace": env_rate("SLUICE_THROTTLE_WORKSPACE", "3000/minute"),
    "submit": env_rate("SLUICE_THROTTLE_SUBMIT", "120/minute"),
}

# The embedded demo's accounts get random passwords, shown once, unless this asks for the
# documented fixed ones (a demo on 127.0.0.1 only).
SLUICE_DEMO_FIXED_PASSWORDS = env_bool("SLUICE_DEMO_FIXED_PASSWORDS", False)

# API tokens (django-rest-knox): only a SHA-512 digest is stored, and each token expires.
REST_KNOX = {
    "TOKEN_TTL": dt.timedelta(hours=env_int("SLUICE_TOKEN_TTL_HOURS", 24 * 30, minimum=1)),
    "AUTH_HEADER_PREFIX": "Token",
    "AUTO_REFRESH": False,
}

REST_FRAMEWORK = {
    # Token first: its scheme is the WWW-Authenticate challenge of a 401.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON only, bounded in size and depth before it is parsed.
    "DEFAULT_PARSER_CLASSES": ["console.api.parsers.BoundedJSONParser"],
    "DEFAULT_THROTTLE_CLASSES": [
        "console.api.throttles.AnonymousThrottle",
        "console.api.throttles.UserThrottle",
        "console.api.throttles.WorkspaceThrottle",
        "console.api.throttles.SubmissionThrottle",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Sluice API",
    "DESCRIPTION": "Admission profiles, approvals, audit history, evaluations and load runs.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery: an embedded filesystem broker by default; Redis or RabbitMQ from CELERY_BROKER_URL.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "") or "filesystem://"
CELERY_BROKER_DIR = VAR_DIR / "broker"
# A queue name of its own lets several deployments (and test runs) share one Redis.
CELERY_TASK_DEFAULT_QUEUE = env_str("SLUICE_CELERY_QUEUE", "") or "sluice"
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_DIR / "queue"),
        "data_folder_out": str(CELERY_BROKER_DIR / "queue"),
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        "processed_folder": str(CELERY_BROKER_DIR / "processed"),
        "store_processed": False,
        # The default one-second poll would put a second on every submit-to-start.
        "polling_interval": env_float(
            "SLUICE_BROKER_POLL_SECONDS", 0.05, minimum=0.0, exclusive=True
        ),
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # An unacknowledged message goes back to the queue after this long; it must outlast the
    # longest evaluation, or a slow run would be delivered twice (the receipt stops the second).
    _visibility = env_int("SLUICE_BROKER_VISIBILITY_TIMEOUT", 3600, minimum=1)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": _visibility,
        # Sweep for abandoned messages often enough that the timeout, not the sweep, decides.
        "unacked_restore_interval": max(1, min(10, _visibility // 5)),
        "unacked_restore_throttle": 1,
    }
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = True
# Result rows older than this are deleted by Celery's built-in `celery.backend_cleanup` task,
# which celery beat schedules daily (run state lives on the run rows, not in the results).
CELERY_RESULT_EXPIRES = env_int("SLUICE_RESULT_EXPIRES_SECONDS", 86_400, minimum=1)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
# A worker is one process: Celery's thread pool takes the doorbells, and one
# event loop in that process runs its evaluations (evaluator/worker/runner.py, docs/running.md).
CELERY_WORKER_POOL = "threads"

# Runs live in the database; workers claim them from there (evaluator/worker/runner.py). Evaluations
# one worker process runs at once on its event loop:
SLUICE_WORKER_SLOTS = env_int("SLUICE_WORKER_SLOTS", 64, minimum=1)
# Threads of a worker process that write receipts and results for its evaluations (each keeps
# one database connection):
SLUICE_WORKER_DB_THREADS = env_int("SLUICE_WORKER_DB_THREADS", 8, minimum=1)
# Evaluations of one workspace running at once across the whole deployment:
SLUICE_WORKSPACE_RUNS_IN_FLIGHT = env_int("SLUICE_WORKSPACE_RUNS_IN_FLIGHT", 16, minimum=1)
# Load runs (and what-if runs) one worker process runs at once, each in a thread of its own:
SLUICE_WORKER_LOAD_SLOTS = env_int("SLUICE_WORKER_LOAD_SLOTS", 2, minimum=1)
# Load runs of one workspace running at once across the whole deployment, and how many may
# wait queued (more are refused, whichever interface submits them):
SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT = env_int("SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT", 1, minimum=1)
SLUICE_WORKSPACE_LOAD_RUNS_QUEUED = env_int("SLUICE_WORKSPACE_LOAD_RUNS_QUEUED", 50, minimum=1)


def _seconds(name: str, default: float, *, minimum: float = 0.0, exclusive: bool = False) -> float:
    value = env_float(name, default, minimum=minimum, exclusive=exclusive)
    return default if value is None else value


# How often a worker looks at the backlog without a doorbell, and sweeps for lost runs:
SLUICE_DISPATCH_POLL_SECONDS = _seconds("SLUICE_DISPATCH_POLL_SECONDS", 2.0, exclusive=True)
# How often a worker writes its runs' heartbeats, and after how long without one a run is
# taken back and claimed again:
SLUICE_RUN_HEARTBEAT_SECONDS = _seconds("SLUICE_RUN_HEARTBEAT_SECONDS", 5.0, exclusive=True)
SLUICE_RUN_STALE_SECONDS = _seconds("SLUICE_RUN_STALE_SECONDS", 30.0, minimum=1.0)
# How long a stopping worker waits for its runs before it gives them back to the backlog:
SLUICE_WORKER_DRAIN_SECONDS = _seconds("SLUICE_WORKER_DRAIN_SECONDS", 8.0)
if SLUICE_RUN_STALE_SECONDS < 3 * SLUICE_RUN_HEARTBEAT_SECONDS:
    raise SettingsError(
        "SLUICE_RUN_STALE_SECONDS must be at least three SLUICE_RUN_HEARTBEAT_SECONDS"
    )

# Deployment-wide admission (admission/coordination): every check about shared capacity is
# decided in Redis, so limits hold for all worker processes together. It defaults to the
# broker's Redis; set SLUICE_ADMISSION_REDIS_URL to empty to keep admission inside one process
# (then exactly one worker process may run).
_broker_redis = CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else ""
SLUICE_ADMISSION_REDIS_URL = env_str("SLUICE_ADMISSION_REDIS_URL", _broker_redis)
SLUICE_ADMISSION_KEY_PREFIX = env_str("SLUICE_ADMISSION_KEY_PREFIX", "sluice")
SLUICE_ADMISSION_LEASE_TTL_MS = env_int("SLUICE_ADMISSION_LEASE_TTL_MS", 20_000, minimum=300)
SLUICE_ADMISSION_HEARTBEAT_MS = env_int("SLUICE_ADMISSION_HEARTBEAT_MS", 1_000, minimum=50)
SLUICE_ADMISSION_RECOVERY_GRACE_MS = env_int("SLUICE_ADMISSION_RECOVERY_GRACE_MS", 3_000)
SLUICE_ADMISSION_TIMEOUT_MS = env_int("SLUICE_ADMISSION_TIMEOUT_MS", 250, minimum=1)
SLUICE_ADMISSION_ON_REDIS_FAILURE = env_choice(
    "SLUICE_ADMISSION_ON_REDIS_FAILURE", "fail-closed", ("fail-closed", "degraded")
)
SLUICE_ADMISSION_EXPECTED_WORKERS = env_int("SLUICE_ADMISSION_EXPECTED_WORKERS", 1, minimum=1)
SLUICE_ADMISSION_BUDGET_TTL_MS = env_int("SLUICE_ADMISSION_BUDGET_TTL_MS", 86_400_000, minimum=1)
SLUICE_ADMISSION_IDLE_TTL_MS = env_int("SLUICE_ADMISSION_IDLE_TTL_MS", 3_600_000, minimum=1)
# How long usage aggregates (evaluator/services/usage.py), hourly and daily, are kept: whole days.
SLUICE_USAGE_RETENTION_DAYS = env_int("SLUICE_USAGE_RETENTION_DAYS", 90, minimum=1)
# With admission kept in one process, how often its worker publishes live figures for the
# admin's Live admission page and /metrics (admission/runtime/live.py):
SLUICE_ADMISSION_SNAPSHOT_SECONDS = _seconds(
    "SLUICE_ADMISSION_SNAPSHOT_SECONDS", 5.0, minimum=0.05, exclusive=True
)

# Where staged-provider load runs send the manifest's calls (evaluator/deployment.py); unset, a
# deployment offers no staged runs.
SLUICE_STAGED_PROVIDER = env_json("SLUICE_STAGED_PROVIDER", None)

# ---------------------------------------------------------------------------------------------
# Serving, health, logs and telemetry: what a production deployment sets (docs/deploying.md).

# Probes answer before host validation (orchestrators call the pod's address); WhiteNoise serves
# the collected static files right after SecurityMiddleware, as its documentation asks.
MIDDLEWARE.insert(0, "config.health.HealthCheckMiddleware")
MIDDLEWARE.insert(1, "config.metrics.MetricsMiddleware")
_security = MIDDLEWARE.index("django.middleware.security.SecurityMiddleware")
MIDDLEWARE.insert(_security + 1, "whitenoise.middleware.WhiteNoiseMiddleware")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compressed copies without hashed names: pages render whether or not collectstatic ran.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# `python -m config.cli web`: gunicorn's bind address, worker processes and timeouts (seconds).
SLUICE_WEB_BIND = env_str("SLUICE_WEB_BIND", "") or "127.0.0.1:8000"
SLUICE_WEB_WORKERS = env_int("SLUICE_WEB_WORKERS", 2, minimum=1)
SLUICE_WEB_THREADS = env_int("SLUICE_WEB_THREADS", 1, minimum=1)
# No request holds a worker longer than this: past it gunicorn's master restarts the worker. Every
# API request is bounded well below it (body caps, linear-time JSON checks, paginated lists).
SLUICE_WEB_TIMEOUT = env_int("SLUICE_WEB_TIMEOUT", 10, minimum=1)
SLUICE_WEB_GRACEFUL_TIMEOUT = env_int("SLUICE_WEB_GRACEFUL_TIMEOUT", 30, minimum=1)
SLUICE_WEB_KEEPALIVE = env_int("SLUICE_WEB_KEEPALIVE", 5, minimum=0)

# /readyz: how long one dependency (broker, Redis) may take to answer before it counts as down.
SLUICE_HEALTH_TIMEOUT_SECONDS = env_int("SLUICE_HEALTH_TIMEOUT_SECONDS", 2, minimum=1)
# /readyz is open to all: its answer is kept this long per process, and one client address gets
# at most this many answers a second (then 429).
SLUICE_READYZ_CACHE_SECONDS = _seconds("SLUICE_READYZ_CACHE_SECONDS", 1.0)
SLUICE_READYZ_PER_SECOND = env_int("SLUICE_READYZ_PER_SECOND", 10, minimum=1)

# /metrics (config/metrics.py): answered to a request that carries `Authorization: Bearer
# <SLUICE_METRICS_TOKEN>` or comes from an address in SLUICE_METRICS_ALLOW_FROM; with neither set
# it answers nobody. Behind a proxy every request comes from the proxy's address: use the token.
SLUICE_METRICS_TOKEN = env_str("SLUICE_METRICS_TOKEN", "")
if SLUICE_METRICS_TOKEN and len(SLUICE_METRICS_TOKEN) < 16:
    raise SettingsError("SLUICE_METRICS_TOKEN must be at least 16 characters long")
SLUICE_METRICS_ALLOW_FROM = env_networks("SLUICE_METRICS_ALLOW_FROM")

# Logs: "text" for people, "json" (one object per line) for collectors.
SLUICE_LOG_FORMAT = env_choice("SLUICE_LOG_FORMAT", "text", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "config.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": SLUICE_LOG_FORMAT},
    },
    "root": {"handlers": ["console"], "level": env_str("SLUICE_LOG_LEVEL", "") or "INFO"},
    # django-axes logs every successful sign-in at INFO; lockouts are warnings.
    "loggers": {
        "axes": {"level": "WARNING"},
        # One line per provider call would bury a busy worker's log.
        "httpx": {"level": "WARNING"},
    },
}
# Celery replaces the root logger's handlers unless told not to; JSON logs must survive that.
CELERY_WORKER_HIJACK_ROOT_LOGGER = SLUICE_LOG_FORMAT != "json"

# OpenTelemetry: exported over OTLP when the standard OTEL_EXPORTER_OTLP_* variables name an
# endpoint; the exporters read the rest of those variables (headers, timeout, TLS) themselves.
SLUICE_OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "") or "sluice"
SLUICE_OTLP_TRACES_PROTOCOL = otlp_protocol("TRACES")
SLUICE_OTLP_METRICS_PROTOCOL = otlp_protocol("METRICS")

# Adapters evaluations may name: JSON text (evaluator/deployment.py reads it), or a mapping when
# set here directly. Empty: one fake adapter.
SLUICE_ADAPTERS: object = env_str("SLUICE_ADAPTERS", "")

# The per-process profile listener (admission/runtime/refresh.py): LISTEN on PostgreSQL unless
# turned off, and a safety-net poll every this many seconds (None: 30 on PostgreSQL, 2 elsewhere).
SLUICE_PROFILE_LISTEN = env_bool("SLUICE_PROFILE_LISTEN", True)
SLUICE_PROFILE_POLL_SECONDS = env_float(
    "SLUICE_PROFILE_POLL_SECONDS", None, minimum=0.0, exclusive=True
)

# Evaluation runs: how often a process running evaluations checks the database for cancel
# requests of its runs (evaluator/worker/cancel_watch.py), and the most decisions one submitted
# ruleset may hold (at most the engine's own ceiling of 10 000).
SLUICE_CANCEL_CHECK_SECONDS = env_float(
    "SLUICE_CANCEL_CHECK_SECONDS", 1.0, minimum=0.0, exclusive=True
)
SLUICE_MAX_DECISIONS = env_int("SLUICE_MAX_DECISIONS", 1000, minimum=1)
# The most characters one decision's rendered prompt may hold (its placeholders filled from the
# input): the provider's context window in characters. Above it a submission is refused with a
# 400 naming the prompt; a run that meets it anyway records a `prompt-too-large` attempt.
SLUICE_MAX_PROMPT_CHARS = env_int("SLUICE_MAX_PROMPT_CHARS", 512_000, minimum=1)
