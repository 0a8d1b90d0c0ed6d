"""A load run's resident memory is the run's own, sampled while it runs."""

from __future__ import annotations

import resource

from evaluator.harness.resources import HeapSampler, resources

_MIB = 1024 * 1024


def test_resident_memory_is_sampled_during_the_run_not_the_process_lifetime_peak():
    # Memory this process held before the run (and gave back) is no part of the run's figure.
    blob = bytearray(192 * _MIB)
    blob[::4096] = b"x" * len(blob[::4096])
    del blob
    lifetime_peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    sampler = HeapSampler()
    held = bytearray(32 * _MIB)
    held[::4096] = b"y" * len(held[::4096])
    sampler.sample()
    used = resources(1000.0, 0.1, sampler.peak_bytes, sampler.peak_resident_bytes)

    assert sampler.peak_bytes >= 30 * _MIB
    assert used["heapPeakMiB"] >= 30
    assert used["rssMiB"] <= lifetime_peak_mib - 150
    del held


def test_without_samples_the_lifetime_peak_stands_in():
    used = resources(1000.0, 0.5, 0, None)
    assert used["rssMiB"] == round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    assert used["cpuPercentOneCore"] == 50.0
