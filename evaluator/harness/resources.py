"""Host samples of a load run: heap peak, CPU time and resident memory.

These describe this machine, not the model, so they are reported but never part of the
deterministic observations that a re-run must reproduce.

The heap peak is sampled, not traced: tracing every allocation (tracemalloc) slows pure-Python
code several times over and would distort the CPU figure of the same run. ``HeapSampler`` reads
the process's resident memory at every progress tick (each 1 % of the virtual window) and at the
end, and reports the largest growth over what was resident when the run started.

The resident memory of a run (``rssMiB``) is the largest resident size sampled while it ran, not
the process's lifetime peak: a worker process that once held more for other work does not charge
that to every load run it serves afterwards.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["HeapSampler", "cpu_time_of", "resources"]

_MIB = 1024.0 * 1024.0

T = TypeVar("T")


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class HeapSampler:
    """The peak growth of resident memory over a run, sampled on demand."""

    __slots__ = ("_baseline", "peak_bytes", "peak_resident_bytes")

    def __init__(self) -> None:
        self._baseline = _resident_bytes()
        self.peak_bytes = 0
        self.peak_resident_bytes = self._baseline

    def sample(self) -> None:
        if self._baseline is None:
            return
        current = _resident_bytes()
        if current is None:
            return
        if current - self._baseline > self.peak_bytes:
            self.peak_bytes = current - self._baseline
        if self.peak_resident_bytes is None or current > self.peak_resident_bytes:
            self.peak_resident_bytes = current


def cpu_time_of(run: Callable[[], T]) -> tuple[T, float]:
    """Run ``run``; return its result and the process CPU seconds it took."""
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
    virtual_duration_ms: float,
    cpu_seconds: float,
    heap_peak_bytes: int,
    resident_peak_bytes: int | None = None,
) -> dict[str, Any]:
    """The ``resources`` object of a load result record.

    ``resident_peak_bytes`` is the run's sampled peak; without it (no ``/proc`` on this platform)
    the process's lifetime peak stands in.
    """
    virtual_seconds = virtual_duration_ms / 1000.0
    cpu_percent = cpu_seconds / virtual_seconds * 100.0 if virtual_seconds > 0 else None
    rss = resident_peak_bytes / _MIB if resident_peak_bytes is not None else _peak_rss_mib()
    return {
        "heapPeakMiB": round(heap_peak_bytes / _MIB, 3),
        "rssMiB": round(rss, 1) if rss is not None else None,
        "cpuSeconds": round(cpu_seconds, 4),
        "cpuPercentOneCore": round(cpu_percent, 5) if cpu_percent is not None else None,
    }
