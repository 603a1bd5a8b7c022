"""Per-phase speculative-decoding statistics (pure logic).

Counts are per request-step that verified drafts ("steps"), so they sum to what vLLM's own
spec-decode counters report: ``verified`` == vLLM's draft tokens, ``accepted`` == its accepted
tokens, ``steps`` == its drafts.  ``zero_depth_steps`` counts request-steps where the policy
chose k=0 (vLLM sees no draft for those).  ``tokens`` counts the tokens decode steps added to
each request's output (after vLLM cuts it at a stop token; a request's first token, from its
prefill step, is not included).

Per policy (requests that chose their own, ``record_policy``): the same counters by the policy's
label; ``snapshot()["policies"]`` adds the server's own policy (``policy_label``) as what the
totals hold beyond them, so the policies' counts sum to the totals.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from dspark_dynamic.core.phase import Phase


_LABELS = {phase: f'"{phase.label}"' for phase in Phase}  # each phase's label as JSON


@dataclass
class PhaseCounters:
    steps: int = 0
    verified: int = 0
    accepted: int = 0
    tokens: int = 0
    zero_depth_steps: int = 0
    depth_counts: dict[int, int] = field(default_factory=dict)
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, depth: int, accepted: int, tokens: int) -> None:
        self.tokens += tokens
        self.depth_counts[depth] = self.depth_counts.get(depth, 0) + 1
        if depth == 0:
            self.zero_depth_steps += 1
            return
        self.steps += 1
        self.verified += depth
        self.accepted += accepted
        if len(self.accepted_per_pos) < depth:
            self.accepted_per_pos.extend([0] * (depth - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance(self) -> float:
        return self.accepted / self.verified if self.verified else 0.0

    @property
    def mean_depth(self) -> float:
        n = sum(self.depth_counts.values())
        return sum(k * c for k, c in self.depth_counts.items()) / n if n else 0.0

    def minus(self, other: "PhaseCounters") -> "PhaseCounters":
        per_pos = [
            a - (other.accepted_per_pos[i] if i < len(other.accepted_per_pos) else 0)
            for i, a in enumerate(self.accepted_per_pos)
        ]
        return PhaseCounters(
            steps=self.steps - other.steps,
            verified=self.verified - other.verified,
            accepted=self.accepted - other.accepted,
            tokens=self.tokens - other.tokens,
            zero_depth_steps=self.zero_depth_steps - other.zero_depth_steps,
            depth_counts={
                k: c - other.depth_counts.get(k, 0)
                for k, c in self.depth_counts.items()
                if c - other.depth_counts.get(k, 0)
            },
            accepted_per_pos=per_pos,
        )

    def copy(self) -> "PhaseCounters":
        return PhaseCounters(
            self.steps,
            self.verified,
            self.accepted,
            self.tokens,
            self.zero_depth_steps,
            dict(self.depth_counts),
            list(self.accepted_per_pos),
        )


class PhaseStats:
    """Cumulative counters per phase, an interval log line, and an optional JSONL trace."""

    def __init__(self, trace: IO[str] | None = None, policy_label: str = "server") -> None:
        self.totals = {phase: PhaseCounters() for phase in Phase}
        self.policy_label = policy_label  # the server's own policy, in the per-policy snapshot
        self.by_policy: dict[str, dict[Phase, PhaseCounters]] = {}  # requests with their own policy
        self._last_logged = {phase: PhaseCounters() for phase in Phase}
        self._trace = trace
        self._rows: list[str] = []  # the trace's rows not written yet (a step's, written with its step row)
        self._ids: dict[str, str] = {}  # request id -> its JSON string

    def record(
        self, phase: Phase, depth: int, accepted: int, tokens: int, request_id: str = ""
    ) -> None:
        """One request-step: ``depth`` drafts verified, ``accepted`` of them accepted."""
        self.totals[phase].add(depth, accepted, tokens)
        if self._trace is not None:  # one JSON row, written with the step's row
            ids = self._ids
            req = ids.get(request_id)
            if req is None:
                if len(ids) > 4096:  # finished requests' ids go now and then
                    ids.clear()
                req = ids[request_id] = json.dumps(request_id)
            self._rows.append(f'{{"t": {time.time():.6f}, "req": {req}, "phase": {_LABELS[phase]}, '
                              f'"k": {depth}, "accepted": {accepted}, "tokens": {tokens}}}\n')

    def trace_policy(self, request_id: str, label: str) -> None:
        """A request chose its own policy: one trace row ``{"req", "policy"}`` before its steps."""
        if self._trace is not None:
            self._rows.append(f'{{"t": {time.time():.6f}, "req": {json.dumps(request_id)}, '
                              f'"policy": {json.dumps(label)}}}\n')

    def record_policy(self, label: str, phase: Phase, depth: int | None, accepted: int, tokens: int) -> None:
        """The same request-step again, by the request's own policy (``depth`` None: tokens
        only, as ``totals`` counts a step that offered no drafts)."""
        counters = self.by_policy.get(label)
        if counters is None:
            counters = self.by_policy[label] = {p: PhaseCounters() for p in Phase}
        if depth is None:
            counters[phase].tokens += tokens
        else:
            counters[phase].add(depth, accepted, tokens)

    def policy_snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per policy label and phase: steps, verified, accepted, tokens, zero-depth steps (the
        server's own policy: the totals less every other policy's)."""
        keys = ("steps", "verified", "accepted", "tokens", "zero_depth_steps")
        rest = {phase: {k: getattr(c, k) for k in keys} for phase, c in self.totals.items()}
        out: dict[str, dict[str, dict[str, int]]] = {}
        for label, counters in self.by_policy.items():
            out[label] = {phase.label: {k: getattr(c, k) for k in keys} for phase, c in counters.items()}
            for phase, c in counters.items():
                for k in keys:
                    rest[phase][k] -= getattr(c, k)
        mine = out.setdefault(self.policy_label, {p.label: dict.fromkeys(keys, 0) for p in Phase})
        for phase, counts in rest.items():
            for k, v in counts.items():
                mine[phase.label][k] += v
        return out

    def record_step_time(
        self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int = -1,
        decode_only: bool = True,
    ) -> None:
        """One engine step: its busy time, drafts verified, requests, drafts asked per request."""
        if self._trace is not None:
            self._rows.append(f'{{"step_s": {seconds:.6f}, "verified_tokens": {verified_tokens}, "reqs": {num_requests}, '
                              f'"draft_depth": {draft_depth}, "decode_only": {"true" if decode_only else "false"}}}\n')
            self._write_rows()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {phase.label: asdict(c) for phase, c in self.totals.items()}

    def interval_lines(self, extra: dict[Phase, str] | None = None) -> list[str]:
        """One line per phase for counts since the previous call (in vLLM's log style)."""
        lines = []
        for phase in Phase:
            delta = self.totals[phase].minus(self._last_logged[phase])
            self._last_logged[phase] = self.totals[phase].copy()
            if not delta.steps and not delta.zero_depth_steps:
                continue
            per_pos = ", ".join(
                f"{a / delta.steps:.3f}" if delta.steps else "0" for a in delta.accepted_per_pos
            )
            line = (
                f"dspark_dynamic [{phase.label}]: Mean acceptance length: "
                f"{1 + delta.accepted / delta.steps if delta.steps else 1.0:.2f}, "
                f"Accepted/Verified draft tokens: {delta.accepted}/{delta.verified}, "
                f"Avg Draft acceptance rate: {100 * delta.acceptance:.1f}%, "
                f"Steps: {delta.steps} (+{delta.zero_depth_steps} at depth 0), "
                f"Mean depth: {delta.mean_depth:.2f}, Tokens: {delta.tokens}, "
                f"Per-position acceptance rate: {per_pos}"
            )
            if extra and phase in extra:
                line += f", {extra[phase]}"
            lines.append(line)
        return lines

    def close(self) -> None:
        """Flush the trace (rows are buffered: the adapter flushes whenever the engine idles)."""
        if self._trace is not None:
            self._write_rows()
            self._trace.flush()

    def _write_rows(self) -> None:
        if self._rows:
            self._trace.write("".join(self._rows))
            self._rows.clear()

    def stop_trace(self) -> None:
        """Stop tracing and close the trace file (after a fault: a flush that fails again, e.g.
        on a full disk, is dropped with the rows it held)."""
        trace = self._trace
        if trace is not None:
            try:
                self._write_rows()
            except OSError:
                pass
        self._trace = None
        if trace is not None:
            try:
                trace.close()
            except OSError:
                pass
