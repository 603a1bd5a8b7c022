"""A depth policy per request, from vLLM's per-request extra arguments (pure logic).

A request chooses its own policy with flat keys in ``SamplingParams.extra_args`` (over the
OpenAI API: ``vllm_xargs``)::

    dspark_dynamic_policy           "fixed" | "phase" | "server" | the server's own policy name
    dspark_dynamic_depth            fixed: drafts verified every step (0 = speculation off)
    dspark_dynamic_reasoning_depth  phase: drafts verified inside <think> (default: the server's)
    dspark_dynamic_answer_depth     phase: drafts verified after it (default: the server's)

``dspark_dynamic_depth`` alone means ``fixed``; either phase depth alone means ``phase``.  A
request without any ``dspark_dynamic_*`` key follows the server's policy.  Depths are integers
in ``[0, num_speculative_tokens]`` (a decimal string is read as its integer: ``vllm_xargs`` from
a command line often arrives as text).

Invariants: ``parse_request_policy`` either returns a ``RequestPolicy`` or raises one
``RequestPolicyError`` naming the key, the value and what is allowed; a fixed or phase override
carries its depths per phase (indexed by ``Phase``); the server's own policy carries none.
Labels are bounded (``fixed K``, ``phase R/A``, the server's policy name): they name the
per-policy metric series.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

PREFIX = "dspark_dynamic_"
POLICY_KEY = "dspark_dynamic_policy"
DEPTH_KEY = "dspark_dynamic_depth"
REASONING_KEY = "dspark_dynamic_reasoning_depth"
ANSWER_KEY = "dspark_dynamic_answer_depth"
REQUEST_KEYS = (POLICY_KEY, DEPTH_KEY, REASONING_KEY, ANSWER_KEY)
SERVER = "server"


class RequestPolicyError(ValueError):
    """A bad per-request policy value; ``key`` and ``value`` name what was refused."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"dspark_dynamic: invalid request argument {key!r}={value!r}; allowed: {allowed}")
        self.key = key
        self.value = value


class RequestPolicy(NamedTuple):
    """One request's policy: ``depths`` is (answer, reasoning) indexed by ``Phase`` for a fixed
    or phase override, None for the server's own policy; ``label`` names it in metrics."""

    label: str
    depths: tuple[int, int] | None


def server_label(policy: str, reasoning_depth: int, answer_depth: int) -> str:
    """The label of the server's configured policy (a phase policy by its depths)."""
    return phase_label(reasoning_depth, answer_depth) if policy == "phase" else policy


def phase_label(reasoning_depth: int, answer_depth: int) -> str:
    return f"phase {reasoning_depth}/{answer_depth}"


def fixed_label(depth: int) -> str:
    return f"fixed {depth}"


def _depth(key: str, value: Any, n: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= n:
        raise RequestPolicyError(key, value, f"an integer in [0, {n}] (num_speculative_tokens)")
    return value


def parse_request_policy(extra_args: Mapping[str, Any] | None, num_speculative_tokens: int, server_policy: str,
                         reasoning_depth: int, answer_depth: int) -> RequestPolicy | None:
    """The request's own policy, or None when it carries no ``dspark_dynamic_*`` key.

    ``server_policy`` with ``reasoning_depth``/``answer_depth``: the server's configured policy
    (a phase override defaults to its depths)."""
    if not extra_args:
        return None
    ours = {k: v for k, v in extra_args.items() if isinstance(k, str) and k.startswith(PREFIX)}
    if not ours:
        return None
    unknown = sorted(set(ours) - set(REQUEST_KEYS))
    if unknown:
        raise RequestPolicyError(unknown[0], ours[unknown[0]], "one of " + ", ".join(REQUEST_KEYS))
    n = num_speculative_tokens
    policy = ours.get(POLICY_KEY)
    has_depth = DEPTH_KEY in ours
    has_phase = REASONING_KEY in ours or ANSWER_KEY in ours
    if policy is None:
        policy = "fixed" if has_depth else "phase" if has_phase else SERVER
    own = ("fixed", "phase", SERVER, server_policy)
    if not isinstance(policy, str) or policy not in own:
        allowed = " | ".join(dict.fromkeys(own))
        raise RequestPolicyError(POLICY_KEY, policy, f"{allowed} (this server runs {server_policy!r})")
    if policy == "fixed":
        if has_phase:
            key = REASONING_KEY if REASONING_KEY in ours else ANSWER_KEY
            raise RequestPolicyError(key, ours[key], f"no phase depth with policy 'fixed' (use {DEPTH_KEY})")
        if not has_depth:
            raise RequestPolicyError(DEPTH_KEY, None, f"an integer in [0, {n}]: policy 'fixed' needs a depth")
        k = _depth(DEPTH_KEY, ours[DEPTH_KEY], n)
        return RequestPolicy(fixed_label(k), (k, k))
    if has_depth:
        raise RequestPolicyError(DEPTH_KEY, ours[DEPTH_KEY], f"no {DEPTH_KEY} with policy {policy!r} (only 'fixed')")
    if policy == "phase":
        r = _depth(REASONING_KEY, ours[REASONING_KEY], n) if REASONING_KEY in ours else reasoning_depth
        a = _depth(ANSWER_KEY, ours[ANSWER_KEY], n) if ANSWER_KEY in ours else answer_depth
        return RequestPolicy(phase_label(r, a), (a, r))
    if has_phase:
        key = REASONING_KEY if REASONING_KEY in ours else ANSWER_KEY
        raise RequestPolicyError(key, ours[key], f"no phase depth with policy {policy!r} (only 'phase')")
    return RequestPolicy(server_label(server_policy, reasoning_depth, answer_depth), None)
