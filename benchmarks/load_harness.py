"""Benchmark of the load harness: runs the management command for each target and reports
wall time of the whole command, harness CPU seconds, cpuPercentOneCore and peak RSS.

    .venv/bin/python benchmarks/load_harness.py [--target NAME ...] [--json]

Figures are host samples; they are reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "manifests/load-manifest.v2.json"
TARGETS = ("admission-controller", "evaluator")


def measure(target: str) -> dict[str, object]:
    """Run the command once for ``target`` in a child process and collect its figures."""
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / f"{target}.json"
        command = [
            sys.executable,
            "manage.py",
            "run_load_harness",
            "--manifest",
            MANIFEST,
            "--target",
            target,
            "--output",
            str(output),
        ]
        started = time.perf_counter()
        child = subprocess.Popen(
            command, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        # wait4 gives this child's own rusage: its CPU and its peak RSS.
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        stderr = child.stderr.read().decode() if child.stderr else ""
        if child.stderr:
            child.stderr.close()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{target}: command failed\n{stderr}")
        record = json.loads(output.read_text(encoding="utf-8"))
    resources = record["resources"]
    return {
        "target": target,
        "virtualSeconds": record["window"]["seconds"],
        "arrivals": record["observations"]["arrivals"],
        "commandWallSeconds": round(wall, 3),
        "commandCpuSeconds": round(usage.ru_utime + usage.ru_stime, 3),
        "harnessCpuSeconds": resources["cpuSeconds"],
        "cpuPercentOneCore": resources["cpuPercentOneCore"],
        "heapPeakMiB": resources["heapPeakMiB"],
        "peakRssMiB": round(usage.ru_maxrss / 1024.0, 1),
        "passed": record["passed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=TARGETS)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args()
    results = [measure(target) for target in options.target or TARGETS]
    if options.json:
        print(json.dumps(results, indent=2))
        return
    columns = (
        ("target", "target", 21),
        ("arrivals", "arrivals", 9),
        ("commandWallSeconds", "wall s", 8),
        ("commandCpuSeconds", "cmd cpu s", 10),
        ("harnessCpuSeconds", "run cpu s", 10),
        ("cpuPercentOneCore", "cpu %1core", 11),
        ("heapPeakMiB", "heap MiB", 9),
        ("peakRssMiB", "rss MiB", 8),
    )
    print("".join(title.rjust(width) for _, title, width in columns))
    for result in results:
        print("".join(str(result[key]).rjust(width) for key, _, width in columns))


if __name__ == "__main__":
    main()
