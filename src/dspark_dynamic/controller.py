"""The per-scheduler depth controller (no vLLM import; duck-typed over vLLM's Request).

Used by the scheduler adapter in three places:
- ``before_schedule(running)``: advance each running request's phase with its newly committed
  output tokens, choose k, and set ``request.spec_token_ids`` to its first k drafts
  (reassigned, never mutated: the async scheduler shares one placeholder list);
- ``after_output(decisions, generated, scheduled_spec)``: count what was verified and
  accepted per phase (the verified count is the one vLLM's scheduler used, so both agree);
- ``forget(request_id)``: drop a finished request's state.

Requests touched: ``request_id``, ``prompt_token_ids``, ``output_token_ids``, ``spec_token_ids``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dspark_dynamic.phase import Phase, PhaseRules, RequestPhase
from dspark_dynamic.policy import BatchDepth, DepthPolicy, apply_batch_depth
from dspark_dynamic.stats import PhaseStats

# request_id -> (phase at scheduling time, chosen depth or -1 when no drafts were offered)
Decisions = dict[str, tuple[Phase, int]]


class DepthController:
    def __init__(
        self,
        rules: PhaseRules,
        policy: DepthPolicy,
        batch_depth: BatchDepth = BatchDepth.PER_REQUEST,
        stats: PhaseStats | None = None,
    ) -> None:
        self.rules = rules
        self.policy = policy
        self.batch_depth = batch_depth
        self.stats = stats if stats is not None else PhaseStats()
        self.states: dict[str, RequestPhase] = {}
        self._last_output_time: float | None = None

    def phase_of(self, request: Any) -> Phase:
        state = self.states.get(request.request_id)
        if state is None:
            state = RequestPhase(self.rules, request.prompt_token_ids)
            self.states[request.request_id] = state
        return state.advance(self.rules, request.output_token_ids)

    def before_schedule(self, running: Iterable[Any]) -> Decisions:
        decisions: Decisions = {}
        drafting: list[tuple[Any, Phase, int]] = []
        for request in running:
            phase = self.phase_of(request)
            if request.spec_token_ids:
                drafting.append((request, phase, self.policy.depth(phase, request.request_id)))
            else:
                decisions[request.request_id] = (phase, -1)
        if not drafting:
            return decisions
        depths = [k for _, _, k in drafting]
        if self.batch_depth is not BatchDepth.PER_REQUEST:
            depths = apply_batch_depth(depths, self.batch_depth)
        for (request, phase, _), k in zip(drafting, depths):
            spec = request.spec_token_ids
            if k < len(spec):
                request.spec_token_ids = spec[:k]
            decisions[request.request_id] = (phase, k)
        return decisions

    @staticmethod
    def generated_counts(
        decisions: Mapping[str, tuple[Phase, int]],
        sampled: Sequence[Sequence[int]] | None,
        req_index: Mapping[str, int],
    ) -> dict[str, int]:
        """Tokens each decided request produced this step.

        Read before vLLM's ``update_from_output`` runs: it truncates the sampled lists in place
        at a stop token, while its own spec-decode counters use the untruncated length.
        """
        if not sampled:
            return {}
        counts = {}
        for req_id in decisions:
            idx = req_index.get(req_id)
            if idx is not None:
                counts[req_id] = len(sampled[idx])
        return counts

    def after_output(
        self,
        decisions: Mapping[str, tuple[Phase, int]],
        generated: Mapping[str, int],
        scheduled_spec: Mapping[str, Sequence[int]],
        kept: Mapping[str, int] | None = None,
    ) -> None:
        """``generated``: sampled tokens per request (as vLLM's acceptance accounting sees them);
        ``kept``: those left after vLLM cut the output at a stop token (default: all)."""
        now = time.monotonic()
        kept = generated if kept is None else kept
        verified_tokens = 0
        num_requests = 0
        for req_id, num_generated in generated.items():
            if not num_generated:
                continue
            phase, chosen = decisions[req_id]
            num_requests += 1
            verified = len(scheduled_spec.get(req_id, ()))
            verified_tokens += verified
            tokens = kept.get(req_id, num_generated)
            if verified:
                accepted = min(num_generated - 1, verified)
                self.stats.record(phase, verified, accepted, tokens, req_id)
                self.policy.observe(phase, verified, accepted, req_id)
            elif chosen == 0:
                self.stats.record(phase, 0, 0, tokens, req_id)
                self.policy.observe(phase, 0, 0, req_id)
            else:
                self.stats.totals[phase].tokens += tokens
        if self._last_output_time is not None and num_requests:
            elapsed = now - self._last_output_time
            self.policy.observe_step(elapsed, verified_tokens, num_requests)
            self.stats.record_step_time(elapsed, verified_tokens, num_requests)
        self._last_output_time = now if num_requests else None

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        self.policy.forget(request_id)

    def prune(self, live_request_ids: Iterable[str]) -> None:
        live = set(live_request_ids)
        for req_id in [r for r in self.states if r not in live]:
            self.forget(req_id)
