"""Host samples of a load run: heap peak, CPU time and resident memory.

These are measurements of this machine, not of the model, so they are reported but never part
of the deterministic observations that a re-run must reproduce.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from typing import Any

__all__ = ["ResourceMeter"]

_MIB = 1024.0 * 1024.0


def _peak_rss_mib() -> float | None:
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / _MIB if sys.platform == "darwin" else peak / 1024.0


class ResourceMeter:
    """Measures the heap peak (tracemalloc) and the process CPU time of one run."""

    __slots__ = ("_cpu_start", "_started_tracing", "cpu_seconds", "heap_peak_bytes")

    def __init__(self) -> None:
        self._cpu_start = 0.0
        self._started_tracing = False
        self.cpu_seconds = 0.0
        self.heap_peak_bytes = 0

    def __enter__(self) -> ResourceMeter:
        self._started_tracing = not tracemalloc.is_tracing()
        if self._started_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self._cpu_start = time.process_time()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cpu_seconds = time.process_time() - self._cpu_start
        self.heap_peak_bytes = tracemalloc.get_traced_memory()[1]
        if self._started_tracing:
            tracemalloc.stop()

    def resources(self, virtual_duration_ms: float) -> dict[str, Any]:
        """The ``resources`` object of a load result record."""
        virtual_seconds = virtual_duration_ms / 1000.0
        cpu_percent = self.cpu_seconds / virtual_seconds * 100.0 if virtual_seconds > 0 else None
        rss = _peak_rss_mib()
        return {
            "heapPeakMiB": round(self.heap_peak_bytes / _MIB, 3),
            "rssMiB": round(rss, 1) if rss is not None else None,
            "cpuSeconds": round(self.cpu_seconds, 4),
            "cpuPercentOneCore": round(cpu_percent, 5) if cpu_percent is not None else None,
        }
