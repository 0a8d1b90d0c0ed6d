"""Host samples of a load run: heap peak, CPU time and resident memory.

These describe this machine, not the model, so they are reported but never part of the
deterministic observations that a re-run must reproduce.

tracemalloc hooks every allocation and slows pure-Python code several times over, so the heap
peak and the CPU time come from two passes over the same deterministic run: one traced, one not.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["cpu_time_of", "heap_peak_of", "resources"]

_MIB = 1024.0 * 1024.0

T = TypeVar("T")


def heap_peak_of(run: Callable[[], T]) -> tuple[T, int]:
    """Run ``run`` under tracemalloc; return its result and the peak bytes allocated during it."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = run()
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        if started:
            tracemalloc.stop()
    return result, max(peak, 0)


def cpu_time_of(run: Callable[[], T]) -> tuple[T, float]:
    """Run ``run`` untraced; return its result and the process CPU seconds it took."""
    start = time.process_time()
    result = run()
    return result, time.process_time() - start


def _peak_rss_mib() -> float | None:
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / _MIB if sys.platform == "darwin" else peak / 1024.0


def resources(
    virtual_duration_ms: float, cpu_seconds: float, heap_peak_bytes: int
) -> dict[str, Any]:
    """The ``resources`` object of a load result record."""
    virtual_seconds = virtual_duration_ms / 1000.0
    cpu_percent = cpu_seconds / virtual_seconds * 100.0 if virtual_seconds > 0 else None
    rss = _peak_rss_mib()
    return {
        "heapPeakMiB": round(heap_peak_bytes / _MIB, 3),
        "rssMiB": round(rss, 1) if rss is not None else None,
        "cpuSeconds": round(cpu_seconds, 4),
        "cpuPercentOneCore": round(cpu_percent, 5) if cpu_percent is not None else None,
    }
