"""Depth policies: how many drafts to verify for a request this step (pure logic).

A policy maps a request's phase to a depth k with 0 <= k <= num_speculative_tokens.
``batch_depth`` then optionally makes the depth uniform over the step's batch, for attention
backends / CUDA graphs that only accept uniform decode batches.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from dspark_dynamic.core.phase import Phase


class BatchDepth(str, enum.Enum):
    """How per-request depths combine inside one step."""

    PER_REQUEST = "per_request"  # each request keeps its own k (mixed batches)
    MAX = "max"  # every decoding request gets the largest k of the step
    MIN = "min"  # every decoding request gets the smallest k of the step


def apply_batch_depth(depths: Sequence[int], mode: BatchDepth) -> list[int]:
    """Return the depths actually used for one step's decoding requests."""
    if not depths or mode is BatchDepth.PER_REQUEST:
        return list(depths)
    k = max(depths) if mode is BatchDepth.MAX else min(depths)
    return [k] * len(depths)


class DepthPolicy(Protocol):
    """Chooses a request's depth from its phase; may learn from observed steps."""

    def depth(self, phase: Phase, request_id: str | None = None) -> int: ...

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None: ...

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        """A decode-only step's busy time, drafts verified, requests and drafts asked per request."""

    def forget(self, request_id: str) -> None: ...


class PhasePolicy:
    """Fixed depth per phase: ``reasoning_depth`` inside <think>, ``answer_depth`` after it."""

    def __init__(self, reasoning_depth: int, answer_depth: int) -> None:
        if reasoning_depth < 0 or answer_depth < 0:
            raise ValueError("depths must be >= 0")
        self._by_phase = (answer_depth, reasoning_depth)  # indexed by Phase value

    def depth(self, phase: Phase, request_id: str | None = None) -> int:
        return self._by_phase[phase]

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        return None

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        return None

    def forget(self, request_id: str) -> None:
        return None

    def describe(self, phase: Phase) -> str:
        return f"depth={self._by_phase[phase]}"
