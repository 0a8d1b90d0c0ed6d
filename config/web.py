"""The production web server: gunicorn serving `config.wsgi`, WhiteNoise serving static files.

`python -m config.cli web` builds the options from settings (`SLUICE_WEB_*`, overridable on the
command line) and runs gunicorn's master in the calling process; see docs/deploying.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

__all__ = ["JsonGunicornLogger", "SluiceWebServer", "web_options"]


class JsonGunicornLogger(Logger):
    """gunicorn's error and access logs, written as JSON lines like the application's."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        from config.logs import JsonFormatter

        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(JsonFormatter())


def web_options(
    settings: Any,
    *,
    bind: str | None = None,
    workers: int | None = None,
    timeout: int | None = None,
) -> dict[str, Any]:
    """gunicorn settings from Django settings; explicit arguments win over them."""
    options: dict[str, Any] = {
        "bind": [bind or settings.SLUICE_WEB_BIND],
        "workers": workers or settings.SLUICE_WEB_WORKERS,
        "threads": settings.SLUICE_WEB_THREADS,
        "timeout": timeout or settings.SLUICE_WEB_TIMEOUT,
        "graceful_timeout": settings.SLUICE_WEB_GRACEFUL_TIMEOUT,
        "keepalive": settings.SLUICE_WEB_KEEPALIVE,
        "accesslog": "-",
        "errorlog": "-",
        "loglevel": logging.getLevelName(logging.getLogger().level).lower(),
        "proc_name": "sluice-web",
        # gunicorn's runtime control socket sits at one path per user: two servers would clash.
        "control_socket_disable": True,
        # Each worker imports the application after the fork: no connection or thread is shared.
        "preload_app": False,
    }
    if settings.SLUICE_LOG_FORMAT == "json":
        options["logger_class"] = JsonGunicornLogger
    return options


class SluiceWebServer(BaseApplication):
    """gunicorn configured in code rather than from a config file or its own command line."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = dict(options)
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from config.wsgi import application

        return application
