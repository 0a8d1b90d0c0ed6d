"""JSON log lines (`SLUICE_LOG_FORMAT=json`): one object per record, for log collectors."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from opentelemetry import trace

__all__ = ["JsonFormatter"]

# Attributes every LogRecord has; anything else on a record came from `extra=` and is kept.
_STANDARD = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None)).keys()
    | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time (UTC, ISO 8601), level, logger, message,
    process, the exception if any, the current trace and span ids if a span is recording,
    and the record's `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=str, ensure_ascii=False)
