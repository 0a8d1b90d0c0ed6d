"""Read deployment settings from the environment, with embedded defaults.

The one place the project reads its environment: `config/settings.py` (and the `config.cli`
launcher, which runs before Django) call these helpers; everything else reads
`django.conf.settings`. An unset or empty variable means the default; a value that cannot be
used raises `SettingsError` naming the variable, so a process refuses to start rather than run
on a guess.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class SettingsError(ValueError):
    """An environment variable holds a value the settings cannot use."""


def env_str(name: str, default: str) -> str:
    """The variable's text, stripped; `default` when it is not set (an empty value is kept)."""
    raw = os.environ.get(name)
    return default if raw is None else raw.strip()


def env_float(
    name: str, default: float | None, *, minimum: float = 0.0, exclusive: bool = False
) -> float | None:
    """A finite number at least (or, `exclusive`, above) `minimum`."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum or (exclusive and value == minimum):
        relation = "above" if exclusive else "at least"
        raise SettingsError(f"{name} must be a finite number {relation} {minimum:g}, got {raw!r}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise SettingsError(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated IP networks (`10.0.0.0/8`, `::1`; a bare address is one host)."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SettingsError(
                f"{name} must list IP networks such as 10.0.0.0/8, got {item!r}"
            ) from None
    return tuple(networks)


def env_json(name: str, default: Any) -> Any:
    """A JSON value from the environment; an empty or unset variable gives ``default``."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return json.loads(raw)
    except ValueError as error:
        raise SettingsError(f"{name} must be JSON: {error}") from None


def database_from_url(url: str, base_dir: Path) -> dict[str, object]:
    """Turn `postgres://user:pass@host:port/name` or `sqlite:///path` into a DATABASES entry."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise SettingsError("DATABASE_URL names no database")
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        # A server that accepts connections but answers nothing (frozen) must not hang every
        # request that opens one: it is answered "database unavailable" after this long.
        options.setdefault("connect_timeout", "5")
        config: dict[str, object] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 0,
            "OPTIONS": options,
        }
        return config
    if scheme == "sqlite":
        path = unquote(parts.path)
        if path in {"", "/"}:
            raise SettingsError("DATABASE_URL sqlite:/// needs a file path")
        # sqlite:///relative.db -> relative to the project, sqlite:////abs.db -> absolute
        name = path[1:]
        resolved = Path(name) if Path(name).is_absolute() else base_dir / name
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(resolved)}
    raise SettingsError(f"DATABASE_URL scheme {scheme!r} is not supported (postgres or sqlite)")


OTLP_PROTOCOLS = ("http/protobuf", "grpc")


def otlp_protocol(signal: str) -> str | None:
    """How the standard `OTEL_*` variables ask for `signal` ("TRACES" or "METRICS") to be
    exported: "grpc" or "http/protobuf", or None when it is not exported.

    A signal is exported when the SDK is not disabled (`OTEL_SDK_DISABLED`), its exporter is
    not `none` (`OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER`) and an endpoint is set
    (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`).
    """
    if env_bool("OTEL_SDK_DISABLED", False):
        return None
    exporter = env_choice(f"OTEL_{signal}_EXPORTER", "otlp", ("otlp", "none"))
    endpoint = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporter == "none" or not endpoint:
        return None
    specific = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
    name = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL" if specific else "OTEL_EXPORTER_OTLP_PROTOCOL"
    # The specification's default; the Python SDK's own default differs by version.
    return env_choice(name, "http/protobuf", OTLP_PROTOCOLS)


_RATE_PERIODS = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")


def env_rate(name: str, default: str | None) -> str | None:
    """A DRF throttle rate such as `60/minute`; `off` (or `none`) turns that throttle off."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"off", "none"}:
        return None
    count, _, period = value.partition("/")
    if not count.isdigit() or int(count) < 1 or period not in _RATE_PERIODS:
        raise SettingsError(f"{name} must look like 60/minute (or off), got {raw!r}")
    return value


def cache_from_url(url: str, *, key_prefix: str) -> dict[str, object]:
    """`redis://host:port/db` (or `rediss://`) becomes Django's Redis cache; `locmem://` memory."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in {"redis", "rediss"}:
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": key_prefix,
        }
    if scheme == "locmem":
        return {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "KEY_PREFIX": key_prefix,
        }
    raise SettingsError(f"SLUICE_CACHE_URL scheme {scheme!r} is not supported (redis or locmem)")


def secret_key_from_environment(*, debug: bool, key_file: Path) -> str:
    """`DJANGO_SECRET_KEY`, else the key the embedded launcher generated in `key_file`.

    With DEBUG off there is no other fallback, so a deployment without a key stops at start
    instead of signing sessions with a key everybody knows.
    """
    key = os.environ.get("DJANGO_SECRET_KEY", "")
    if key:
        return key
    if key_file.is_file():
        return key_file.read_text(encoding="utf-8").strip()
    if debug:
        # A development server: a fresh key per process only signs its users out on restart.
        return "debug-only-" + secrets.token_urlsafe(48)
    raise SettingsError(
        "DJANGO_SECRET_KEY is not set and DEBUG is off. Set DJANGO_SECRET_KEY to a long random "
        "value shared by every web and worker process (docs/security.md), or start the embedded "
        f"demo with `make run`, which generates one in {key_file}."
    )


def secret_key_file_create(key_file: Path) -> None:
    """Write a new random key to `key_file` (readable by its owner only) unless one is there."""
    key_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_urlsafe(64) + "\n")
