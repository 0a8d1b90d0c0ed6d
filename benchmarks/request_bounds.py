"""What the bounded checks cost at their caps: the JSON depth check and the prompt-length count.

Run:  .venv/bin/python benchmarks/request_bounds.py [--size BYTES]

For each text shape that made the former depth check quadratic, and each that stresses a bracket
scanner, the CPU time of `nesting_depth` at a quarter, a half and the whole body cap (the best of
five), with the growth from a quarter to the whole (4.0 is linear); then the time to count a
prompt's rendered length for the expansion that once rendered a gigabyte. Figures only; the
bounds are asserted in tests/console/api/test_request_cost.py and
tests/evaluator/test_prompt_bounds.py.
"""

from __future__ import annotations

import argparse
import time

from console.api.untrusted_json import nesting_depth
from evaluator.engine.rulesets import Decision

SHAPES = {
    "unclosed string of escaped quotes": ('{"input": "', '\\"'),
    "escaped quotes ending in a backslash": ('{"input": "', '\\"\\'),
    "quote runs": ("", '"'),
    "opening brackets": ("", "["),
    "empty arrays": ("", "[]"),
    "small strings": ("[", '"a",'),
    "objects with escapes": ("[", '{"a":[1,{"b":"x\\\\"}]},'),
}


def _text(prefix: str, fragment: str, size: int) -> str:
    return prefix + fragment * max(1, (size - len(prefix)) // len(fragment))


def _best(function, *args, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        function(*args)
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_048_576, help="the body cap, bytes")
    size = parser.parse_args().size
    print(f"nesting_depth, CPU ms at {size // 4}, {size // 2} and {size} bytes (growth x4 → ?)")
    for name, (prefix, fragment) in SHAPES.items():
        times = [_best(nesting_depth, _text(prefix, fragment, size // part)) for part in (4, 2, 1)]
        growth = times[2] / times[0] if times[0] else float("nan")
        shown = "  ".join(f"{t * 1000:7.2f}" for t in times)
        print(f"  {name:<38} {shown}   x{growth:.1f}")

    doc = {
        "id": "d0",
        "prompt": "${x}" * 5000,
        "allowedOutputs": ["yes", "no"],
        "binding": {"primary": {"adapter": "fake", "model": "m", "timeoutMs": 1000}},
    }
    decision = Decision.from_dict(doc, "decision")
    texts = {"x": "v" * 200_000}
    seconds = _best(decision.rendered_length, texts)
    length = decision.rendered_length(texts)
    print(f"rendered_length of '${{x}}' x 5000 with a 200 000-character x: {length} characters")
    print(f"  counted in {seconds * 1000:.2f} ms CPU, without rendering it")


if __name__ == "__main__":
    main()
