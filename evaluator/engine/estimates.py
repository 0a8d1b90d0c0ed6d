"""The default admission estimate of one dispatch, from the prompt and the target."""

from __future__ import annotations

import math
from collections.abc import Callable

from admission.core import Estimate
from evaluator.engine.rulesets import Decision, Target

__all__ = ["EstimateFn", "default_estimate"]

EstimateFn = Callable[[Decision, Target, str], Estimate]
# A common rule of thumb for English text with BPE tokenizers.
BYTES_PER_TOKEN = 4


def default_estimate(decision: Decision, target: Target, prompt: str) -> Estimate:
    """Prompt tokens (bytes / 4, rounded up) plus the target's output allowance; cost from the
    target's price per token, unknown when it has none (and fails closed where a profile caps
    cost). One item, one attempt, one unit of retained work."""
    size = len(prompt.encode("utf-8"))
    tokens = math.ceil(size / BYTES_PER_TOKEN) + target.max_output_tokens
    cost = tokens * target.cost_per_token_usd if target.cost_per_token_usd is not None else None
    return Estimate(
        tokens=tokens,
        cost_usd=cost,
        request_bytes=size,
        items=1,
        attempts=1,
        batch_size=1,
        retained_work=1,
    )
