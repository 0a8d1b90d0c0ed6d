from __future__ import annotations

import hashlib

from evaluator.harness.arrivals import ArrivalModel, generate_arrivals, mulberry32

# First outputs of the JavaScript reference:
#   function mulberry32(a) { return function() { let t = a += 0x6D2B79F5;
#     t = Math.imul(t ^ t >>> 15, t | 1); t ^= t + Math.imul(t ^ t >>> 7, t | 61);
#     return ((t ^ t >>> 14) >>> 0) / 4294967296; } }
JS_REFERENCE = {
    0: [0.26642920868471265, 0.0003297457005828619, 0.2232720274478197, 0.1462021479383111],
    1: [0.6270739405881613, 0.002735721180215478, 0.5274470399599522, 0.9810509674716741],
    2601: [0.34634330682456493, 0.14941075607202947, 0.7996441803406924, 0.4834831568878144],
    0xFFFFFFFF: [0.8964226141106337, 0.189478256739676, 0.7156526781618595, 0.9440599093213677],
}

# The v2 timeline rendered by an independent JavaScript implementation of the arrival model, one
# line per arrival: atMs,principal,provider,tokens,serviceMs,failsFirstAttempt,cancelAtMs (empty
# if none).
JS_TIMELINE_990S = (20103, "5e05a47682d9568e8ae7b0caa4b3bac9213453c8df387e6cc7aa8ac7d89e303c")
JS_TIMELINE_90S = (2378, "9694277d45086dfca59fc1208b4e9b1ba6a828be2a42129f7dd4af547b8d6b63")


def _render(arrivals):
    lines = [
        ",".join(
            [
                str(a.at_ms),
                a.principal_id,
                a.provider_id,
                str(a.tokens),
                str(a.service_ms),
                "true" if a.fails_first_attempt else "false",
                "" if a.cancel_at_ms is None else str(a.cancel_at_ms),
            ]
        )
        for a in arrivals
    ]
    return ("\n".join(lines) + "\n").encode()


def test_CNC_LOAD_001_mulberry32_matches_the_javascript_reference():
    for seed, expected in JS_REFERENCE.items():
        draw = mulberry32(seed)
        assert [draw() for _ in expected] == expected
    # Seeds are taken mod 2**32 as JavaScript's ToUint32 does.
    assert mulberry32(-1)() == JS_REFERENCE[0xFFFFFFFF][0]


def test_CNC_LOAD_001_arrivals_match_the_reference_timeline(manifest_v2):
    model = ArrivalModel.from_manifest(manifest_v2)
    for end_ms, (count, digest) in ((990_000, JS_TIMELINE_990S), (90_000, JS_TIMELINE_90S)):
        arrivals = generate_arrivals(model, end_ms)
        assert len(arrivals) == count
        assert hashlib.sha256(_render(arrivals)).hexdigest() == digest


def test_CNC_LOAD_001_arrivals_are_identical_on_repeat(manifest_v2):
    model = ArrivalModel.from_manifest(manifest_v2)
    first = generate_arrivals(model, 990_000)
    second = generate_arrivals(ArrivalModel.from_manifest(manifest_v2), 990_000)
    assert first == second
    # The 90 s evaluator sample is the prefix of the full schedule.
    assert generate_arrivals(model, 90_000) == first[: len(generate_arrivals(model, 90_000))]


def test_CNC_LOAD_001_every_principal_and_provider_takes_part(manifest_v2):
    arrivals = generate_arrivals(ArrivalModel.from_manifest(manifest_v2), 990_000)
    declared = {p["id"] for p in manifest_v2.document["principals"]}
    assert {a.principal_id for a in arrivals} == declared
    assert {a.provider_id for a in arrivals} == set(manifest_v2.document["providers"])
    assert {a.principal_class for a in arrivals} == {"noisy", "quiet"}
    assert any(a.huge for a in arrivals)
    assert any(a.fails_first_attempt for a in arrivals)
    assert any(a.cancel_at_ms is not None for a in arrivals)
    times = [a.at_ms for a in arrivals]
    assert times == sorted(times)
    assert all(40 <= a.service_ms <= 160 for a in arrivals)
    for a in arrivals:
        assert a.tokens == (6000 if a.huge else 200)
        assert a.cancel_at_ms is None or a.cancel_at_ms == a.at_ms + 50


def test_CNC_LOAD_001_spike_rate_is_above_twice_the_average(manifest_v2):
    arrivals = generate_arrivals(ArrivalModel.from_manifest(manifest_v2), 990_000)
    average_per_s = len(arrivals) / 990
    spike = [a for a in arrivals if 60_000 <= a.at_ms < 70_000]
    spike_per_s = len(spike) / 10
    assert spike_per_s > 2 * average_per_s
    load = [a for a in arrivals if a.at_ms < 60_000]
    assert 15 < len(load) / 60 < 25
