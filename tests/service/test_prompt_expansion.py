"""Bounded prompt expansion with real processes: an evaluation whose every prompt renders to the
deployment's cap keeps the worker's memory within the documented bound and another workspace's
evaluations within 1.5 times their idle latency; one character more is refused at submission."""

from __future__ import annotations

import statistics
import threading
from pathlib import Path
from typing import Any

import pytest

from console.forms.runs import example_request
from evaluator.engine.rulesets import DEFAULT_MAX_PROMPT_CHARS

from .conftest import Deployment
from .test_fairness import QUIET_WORKSPACE, _latency, _quiet_run

pytestmark = pytest.mark.celery

# The deployment's default cap (SLUICE_MAX_PROMPT_CHARS), which the test leaves as it is.
PROMPT_CAP = DEFAULT_MAX_PROMPT_CHARS
DECISIONS = 40
# docs/running.md: one evaluation's prompts add at most this much to the worker's peak RSS
# (its concurrent decisions x a few copies of a prompt at the cap, with room to spare).
RSS_GROWTH_BOUND_MIB = 64


def _expanding(copies: int, value_chars: int) -> dict[str, Any]:
    document = example_request(DECISIONS)
    for decision in document["ruleset"]["decisions"]:
        decision["prompt"] = "${text}" * copies
    document["input"] = {"text": "v" * value_chars}
    return document


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc")


def test_prompts_at_the_cap_keep_the_worker_small_and_other_tenants_fast(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, "full")
    deployment.env.update(
        SLUICE_MAX_DECISIONS=str(DECISIONS),
        SLUICE_ADAPTERS=deployment.adapters(latency_ms=150),
    )
    try:
        deployment.setup()
        deployment.django(QUIET_WORKSPACE)
        deployment.start_web()
        worker = deployment.start_worker()

        # One character over the cap is refused before anything is stored or queued.
        over = deployment.api(
            "POST", "/api/workspaces/demo/evaluations/", json=_expanding(10, PROMPT_CAP // 10 + 1)
        )
        assert over.status_code == 400, over.text
        fields = over.json()["error"]["fields"]
        assert list(fields) == ["ruleset.decisions[0].prompt"]
        assert (
            f"renders to {PROMPT_CAP + 10} characters" in fields["ruleset.decisions[0].prompt"][0]
        )

        _quiet_run(deployment)  # warm: registry, connections, adapters
        idle = statistics.median(_latency(_quiet_run(deployment)) for _ in range(5))
        before = _peak_rss_mib(worker.pid)

        big = deployment.submit(_expanding(10, PROMPT_CAP // 10))["id"]
        loaded: list[float] = []
        finished = threading.Event()

        def watch() -> None:
            deployment.wait_run(big, timeout=120)
            finished.set()

        watcher = threading.Thread(target=watch)
        watcher.start()
        while not finished.is_set():
            run = _quiet_run(deployment)
            if not finished.is_set():
                loaded.append(_latency(run))
        watcher.join()
        after = _peak_rss_mib(worker.pid)

        result = deployment.evaluation(big)
        assert result["status"] == "completed", result
        decisions = result["result"]["decisions"]
        assert len(decisions) == DECISIONS
        assert all(decision["status"] == "succeeded" for decision in decisions), decisions[:2]
        assert len(loaded) >= 3, loaded
        assert statistics.median(loaded) <= 1.5 * idle, f"idle {idle:.3f} s, loaded {loaded}"
        assert after - before <= RSS_GROWTH_BOUND_MIB, f"peak RSS {before:.0f} -> {after:.0f} MiB"
    finally:
        deployment.stop()
