"""A Celery worker, as `celery -A config worker ...` starts it, that notes when each phase of an
evaluation begins and ends, for `benchmarks/durable_parallel.py`'s phase breakdown.

Run:  SLUICE_BENCH_TRACE=/tmp/trace.jsonl python benchmarks/traced_worker.py -A config worker ...

Every event is one JSON line `{"at": time.monotonic(), "event": NAME, ...}` appended to the file
`SLUICE_BENCH_TRACE` names. `time.monotonic()` is the host's monotonic clock, the same in every
process, so the benchmark lines these up with what its loopback provider saw. The worker itself
runs unchanged: the notes wrap the functions that begin and end each phase (doorbell, claim,
run start, admission, slot write, adapter call, record, receipt close, result write).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

_lock = threading.Lock()
_decision: contextvars.ContextVar[int | None] = contextvars.ContextVar("decision", default=None)
_out = open(os.environ["SLUICE_BENCH_TRACE"], "a", encoding="utf-8")  # noqa: SIM115


_pending: list[tuple[float, str, dict[str, Any]]] = []


def note(event: str, **fields: Any) -> None:
    """Keep the event in memory (cheap on the event loop); `flush` writes it out."""
    _pending.append((time.monotonic(), event, fields))


def flush() -> None:
    with _lock:
        taken = _pending[:]
        del _pending[: len(taken)]
        for at, event, fields in taken:
            _out.write(json.dumps({"at": at, "event": event, **fields}, default=str) + "\n")
        _out.flush()


def _wrap(owner: Any, name: str, describe: Callable[..., dict[str, Any]] | None = None) -> None:
    """Note `NAME.start` and `NAME.end` around `owner.name` (a function or coroutine function)."""
    original = getattr(owner, name)
    label = f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"
    fields = describe or (lambda *args, **kwargs: {})

    if _is_coroutine(original):

        @functools.wraps(original)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            extra = fields(*args, **kwargs)
            note(label + ".start", **extra)
            try:
                return await original(*args, **kwargs)
            finally:
                note(label + ".end", **extra)

        setattr(owner, name, traced_async)
        return

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        extra = fields(*args, **kwargs)
        note(label + ".start", **extra)
        try:
            return original(*args, **kwargs)
        finally:
            note(label + ".end", **extra)

    setattr(owner, name, traced)


def _is_coroutine(function: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


def install() -> None:
    import django

    django.setup()

    from evaluator.engine import attempts, scheduler
    from evaluator.engine.adapters import openai_http
    from evaluator.engine.receipts import ReceiptJournal
    from evaluator.services import runs as run_services
    from evaluator.worker import dispatch, execute, runner
    from evaluator.worker.receipts_db import DatabaseReceiptStore

    def call(adapter: Any, adapter_call: Any) -> dict[str, Any]:
        return {"decision": adapter_call.decision_id, "number": adapter_call.attempt}

    def decision(_self: Any, index: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"index": index}

    def attempt(ctx: Any, place: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # `run_attempt(ctx, place)`, or `(ctx, index, ...)` in the release before.
        index = int(getattr(place, "index", place))
        # The attempt's task runs its admission request: that note names the decision too.
        _decision.set(index)
        return {"index": index}

    def slots(_self: Any, key: Any, written: Any, **kwargs: Any) -> dict[str, Any]:
        # A slot write names the decisions whose slots it holds.
        return {"indexes": [slot["decisionIndex"] for slot in written]}

    def acquire(_self: Any, request: Any) -> dict[str, Any]:
        return {"index": _decision.get()}

    _wrap(runner.Runner, "wake")
    _wrap(dispatch, "runs_claim")
    _wrap(runner.Runner, "_start")
    _wrap(execute, "evaluate")
    _wrap(execute, "run_complete")
    _wrap(run_services, "run_finish")
    _wrap(ReceiptJournal, "open")
    _wrap(ReceiptJournal, "mark_dispatch", decision)
    _wrap(ReceiptJournal, "record_attempt", decision)
    _wrap(ReceiptJournal, "finish")
    _wrap(DatabaseReceiptStore, "add_slots", slots)
    _wrap(DatabaseReceiptStore, "update")
    _wrap(runner.SlotFreeingController, "acquire", acquire)
    _wrap(attempts, "run_attempt", attempt)
    scheduler.run_attempt = attempts.run_attempt  # type: ignore[attr-defined]
    _wrap(openai_http.OpenAIChatAdapter, "invoke", call)
    _wrap(runner.Runner, "_ended")
    # A run's notes are written once its result is (the benchmark reads them after that).
    finish = run_services.run_finish

    @functools.wraps(finish)
    def finish_then_flush(*args: Any, **kwargs: Any) -> Any:
        try:
            return finish(*args, **kwargs)
        finally:
            flush()

    run_services.run_finish = finish_then_flush


def main() -> None:
    install()
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
