"""The per-scheduler depth controller (no vLLM import; duck-typed over vLLM's Request).

Used by the scheduler adapter in four places, in this order within one engine step:
- ``before_schedule(running)``: advance each running request's phase with its newly committed
  output tokens and set ``request.spec_token_ids`` to its first k drafts: k is the depth planned
  for this step (re-chosen if the phase changed since), or, for a batch policy (one with
  ``gate``), what the policy admits from the whole batch's drafts; reassigned, never mutated:
  the async scheduler shares one placeholder list;
- ``plan_drafts(scheduled)``: once vLLM has scheduled the step, choose every scheduled request's
  depth for its *next* step (a batch policy's ``plan`` sees them all at once) and return the
  deepest, so the drafter drafts no more than will be verified (``None``: nothing to plan);
- ``after_output(decisions, counted, tokens, step)``: count what was verified and accepted per
  phase (the numbers vLLM's own spec-decode stats counted, so both agree however a request
  ended), and hand decode-only step timings to the policy;
- ``forget(request_id)``: drop a finished request's state.

Draft confidences (``set_confidences``, from the adapter, with the draft ids of the step that
will verify them): a policy that reads them (``policy.reads_confidences``) gets each request's with
its drafts in ``gate``; the features of the drafts it verifies are kept until the step's output,
and what was accepted calibrates them (``policy.observe_confidence``).  Confidences are used
once: a request without fresh ones is gated without (``None``).  ``policy.begin_step``, when
present, runs first in every ``before_schedule`` (a policy's per-step draws).

Example: phase policy 1/2, a request inside ``<think>`` with drafts ``[a, b]``: it is planned at
depth 1, the drafter is asked for 1 draft, and its next step verifies ``[a]``.

A policy per request (``request_policy``, from the adapter: the request's own ``RequestPolicy``
or None, read once when the request is first seen): a fixed or phase override gives that request
its own depths in every step; it takes no part in a batch policy's ``gate``/``plan`` decision but
feeds what it measured (acceptance, step times, confidences) to the shared policy like any other
request.  Under ``batch_depth`` max/min the step's one depth is the max/min over every request's,
overridden or not.  Requests with an override are counted per policy label as well
(``stats.record_policy``); those without one are the server's policy.

Context (a policy with a ``contexts`` dict): at each step's gate and plan, ``contexts[request_id]``
is the request's prompt and output tokens in ``costs.context_units``; a decode step's
``observe_step`` gets the step's context and its verified drafts times their requests' contexts
(a request freed before its last output counts at its last).

Requests touched: ``request_id``, ``prompt_token_ids`` (``num_prompt_tokens`` where present),
``output_token_ids``, ``spec_token_ids`` (and ``all_token_ids`` where a reasoning parser's API follows
the phase: a ``PhaseDetector``, ``PhaseRules`` of marker ids or the adapter's parser-backed one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from dspark_dynamic.core.costs import context_units_until
from dspark_dynamic.core.phase import Phase, PhaseDetector, PhaseTracker
from dspark_dynamic.core.policy import BatchDepth, DepthPolicy, apply_batch_depth
from dspark_dynamic.core.request_policy import RequestPolicy
from dspark_dynamic.core.stats import PhaseStats

# request_id -> (phase at scheduling time, chosen depth or -1 when no drafts were offered)
Decisions = dict[str, tuple[Phase, int]]


class StepTiming(NamedTuple):
    """One engine step as the cost model sees it.

    ``seconds`` excludes idle time before the step was scheduled; ``decode_only`` is False when
    any request prefilled in it (such a step says nothing about verify cost); ``draft_depth``
    is the number of drafts per request the drafter was asked for in this step.
    """

    seconds: float
    decode_only: bool
    num_requests: int
    draft_depth: int


class DepthController:
    def __init__(
        self,
        rules: PhaseDetector,
        policy: DepthPolicy,
        batch_depth: BatchDepth = BatchDepth.PER_REQUEST,
        stats: PhaseStats | None = None,
        request_policy: Callable[[Any], RequestPolicy | None] | None = None,
    ) -> None:
        self.rules = rules
        self.policy = policy
        self.batch_depth = batch_depth
        self.stats = stats if stats is not None else PhaseStats()
        self.states: dict[str, PhaseTracker] = {}
        self.plans: dict[str, tuple[Phase, int]] = {}  # depth chosen for a request's next step
        self.confidences: dict[str, list[float]] = {}  # features of each request's current drafts
        self.verifying: dict[str, list[float]] = {}  # features of the drafts a step verifies
        self._seen: dict[str, tuple[Phase, int]] = {}  # this step's phase and output length per request
        self._request_policy = request_policy  # a request's own policy, read when it is first seen
        self.overrides: dict[str, tuple[int, int]] = {}  # request -> its own depths, by phase
        self.labels: dict[str, str] = {}  # request -> its own policy's label (overridden requests)
        self._ended: dict[str, str] = {}  # labels of requests freed since the last step's output
        self._contexts: dict[str, float] | None = getattr(policy, "contexts", None)  # the policy's, filled here
        self._context_at: dict[str, list] = {}  # [prompt tokens, output length its units change at] per request
        self._ended_contexts: dict[str, float] = {}  # contexts of requests freed since the last decode step
        self._gate = getattr(policy, "gate", None)  # a batch policy decides what each step verifies
        self._plan = getattr(policy, "plan", None)  # ... and how deep the batch drafts
        self._begin = getattr(policy, "begin_step", None)
        self._account = getattr(policy, "account_step", None)  # a policy's live estimate
        self._wants_confidences = bool(getattr(policy, "reads_confidences", False))
        self._uniform = None if batch_depth is BatchDepth.PER_REQUEST else batch_depth.value  # for ``gate``
        self._drafter_depth = min if batch_depth is BatchDepth.MIN else max  # of the planned depths

    def set_confidences(self, request_id: str, features: list[float]) -> None:
        """The drafter's features of ``request_id``'s current drafts (one per draft, in order)."""
        if self._wants_confidences:
            self.confidences[request_id] = features

    def _track(self, request: Any) -> PhaseTracker:
        """A request seen for the first time: its phase tracker, and its own policy if it has one."""
        state = self.states[request.request_id] = self.rules.track(request)
        if self._contexts is not None:
            prompt = getattr(request, "num_prompt_tokens", None)
            prompt = prompt if isinstance(prompt, int) else len(request.prompt_token_ids or ())
            self._context_at[request.request_id] = [prompt, 0]
        if self._request_policy is not None:
            own = self._request_policy(request)
            if own is not None:
                self.labels[request.request_id] = own.label
                self.stats.trace_policy(request.request_id, own.label)
                if own.depths is not None:
                    self.overrides[request.request_id] = own.depths
        return state

    def phase_of(self, request: Any) -> Phase:
        state = self.states.get(request.request_id)
        if state is None:
            state = self._track(request)
        return state.advance(self.rules, request.output_token_ids)

    def _depth(self, request_id: str, phase: Phase) -> int:
        plan = self.plans.get(request_id)
        if plan is not None and plan[0] is phase:
            return plan[1]
        return self.policy.depth(phase, request_id)

    def _own_depth(self, request_id: str, phase: Phase) -> int:
        """``_depth``, for a step in which some request has its own policy."""
        own = self.overrides.get(request_id)
        return self._depth(request_id, phase) if own is None else own[phase]

    def before_schedule(self, running: Iterable[Any]) -> Decisions:
        """Trim each running request's drafts to its depth; returns what was decided."""
        decisions: Decisions = {}
        drafting: list[tuple[Any, Phase]] = []
        seen = self._seen
        seen.clear()
        if self._begin is not None:
            self._begin()
        states, rules, plans, contexts, context_at = self.states, self.rules, self.plans, self._contexts, self._context_at
        for request in running:
            req_id = request.request_id
            output = request.output_token_ids
            state = states.get(req_id)
            if state is None:
                state = self._track(request)
            phase = state.advance(rules, output)
            n = len(output)
            seen[req_id] = (phase, n)
            if contexts is not None and n >= (at := context_at[req_id])[1]:
                self._refresh_context(req_id, at, n)
            if request.spec_token_ids:
                drafting.append((request, phase))
            else:  # no drafts: none offered (-1), or none asked for (depth 0 planned)
                plan = plans.get(req_id)
                decisions[req_id] = (phase, 0 if plan is not None and plan[1] == 0 else -1)
        if not drafting:
            self.confidences.clear()
            return decisions
        if self._gate is not None:
            if self.overrides:
                self._gated_with_overrides(drafting, decisions)
            else:
                self._gated(drafting, decisions)
            return decisions
        if self.overrides:
            depths = [self._own_depth(request.request_id, phase) for request, phase in drafting]
        else:
            depths = [self._depth(request.request_id, phase) for request, phase in drafting]
        if self._uniform is not None:
            depths = apply_batch_depth(depths, self.batch_depth)
        self.confidences.clear()  # they describe this step's drafts only
        self._trim(drafting, depths, decisions)
        return decisions

    @staticmethod
    def _trim(drafting: list[tuple[Any, Phase]], depths: Iterable[int], decisions: Decisions) -> None:
        """Each request keeps its first k drafts (reassigned, never mutated: the async scheduler
        shares one placeholder list); the depth kept goes into ``decisions``."""
        for (request, phase), k in zip(drafting, depths):
            spec = request.spec_token_ids
            if k < len(spec):
                request.spec_token_ids = spec[:k]
            else:
                k = len(spec)
            decisions[request.request_id] = (phase, k)

    def _gated(self, drafting: list[tuple[Any, Phase]], decisions: Decisions) -> None:
        """The policy's depths for the step's drafting requests (each with its fresh confidences,
        when it has them), into ``decisions``; the features of the drafts verified are kept."""
        confidences = self.confidences
        items = self._items(drafting, confidences.pop)
        confidences.clear()  # they describe this step's drafts only
        verifying = self.verifying
        for (request, _phase), (phase, req_id, f, _n), k in zip(drafting, items, self._gate(items, self._uniform)):
            spec = request.spec_token_ids
            if k < len(spec):
                request.spec_token_ids = spec[:k]
            else:
                k = len(spec)
            decisions[req_id] = (phase, k)
            if f is not None:
                verifying[req_id] = f[:k]

    def _gated_with_overrides(self, drafting: list[tuple[Any, Phase]], decisions: Decisions) -> None:
        """``_gated`` for a step with overridden requests: the policy gates the others; each
        overridden request verifies its own depth (the step's max/min over all, when uniform);
        the features of every verified draft are kept for calibration."""
        overrides, confidences = self.overrides, self.confidences
        gated = [row for row in drafting if row[0].request_id not in overrides]
        own: dict[str, int] = {}
        if gated:
            for (request, _phase), k in zip(gated, self._gate(self._items(gated, confidences.get), self._uniform)):
                own[request.request_id] = k
        depths = [own[r.request_id] if r.request_id in own else overrides[r.request_id][p] for r, p in drafting]
        if self._uniform is not None:
            depths = apply_batch_depth([min(k, len(r.spec_token_ids)) for (r, _p), k in zip(drafting, depths)],
                                       self.batch_depth)
        self._trim(drafting, depths, decisions)
        if confidences:
            for request, _phase in drafting:
                f = confidences.get(request.request_id)
                k = decisions[request.request_id][1]
                if f is not None and k:
                    self.verifying[request.request_id] = f[:k]
        confidences.clear()  # they describe this step's drafts only

    def _items(self, drafting: list[tuple[Any, Phase]], take: Callable[[str, None], Any]) -> list[tuple]:
        """The gate's items: (phase, request id, its confidences by ``take`` or None, drafts usable)."""
        items, confidences = [], self.confidences
        for request, phase in drafting:
            f = take(request.request_id, None) if confidences else None
            n = len(request.spec_token_ids)
            items.append((phase, request.request_id, f, n if f is None or len(f) >= n else len(f)))
        return items

    def plan_drafts(self, scheduled: Iterable[Any]) -> int | None:
        """Choose the next step's depth of every request that drafts in this step.

        Returns the number of drafts per request the drafter should produce (the deepest plan,
        or the shallowest under ``batch_depth: min``), or None when nothing was scheduled.
        """
        seen, rows = self._seen, []
        for request in scheduled:  # the phase ``before_schedule`` found, unless the output grew since
            req_id = request.request_id
            found = seen.get(req_id)
            if found is not None and found[1] == len(request.output_token_ids):
                rows.append((found[0], req_id))
            else:
                rows.append((self.phase_of(request), req_id))
                if self._contexts is not None:
                    n = len(request.output_token_ids)
                    if n >= (at := self._context_at[req_id])[1]:
                        self._refresh_context(req_id, at, n)
        if not rows:
            return None
        if self.overrides:
            planned = self._planned_with_overrides(rows)
        elif self._plan is not None:
            planned = self._plan(rows)
        else:
            planned = [self.policy.depth(phase, req_id) for phase, req_id in rows]
        plans = self.plans
        for row, k in zip(rows, planned):
            plans[row[1]] = (row[0], k)
        return self._drafter_depth(planned)

    def _planned_with_overrides(self, rows: list[tuple[Phase, str]]) -> list[int]:
        """Next-step depths where some requests have their own: theirs, and the policy's (its
        batch ``plan`` over the others alone) for the rest."""
        overrides = self.overrides
        if self._plan is not None:
            others = [row for row in rows if row[1] not in overrides]
            theirs = iter(self._plan(others) if others else ())
            return [overrides[r][p] if r in overrides else next(theirs) for p, r in rows]
        depth = self.policy.depth
        return [overrides[r][p] if r in overrides else depth(p, r) for p, r in rows]

    def after_output(
        self,
        decisions: Mapping[str, tuple[Phase, int]],
        counted: Mapping[str, tuple[int, int]],
        tokens: Mapping[str, int],
        step: StepTiming | None = None,
    ) -> None:
        """Account one finished step.

        ``counted``: request -> (drafts verified, drafts accepted), exactly as vLLM's spec-decode
        stats counted them (so the sums always agree, however a request ended); ``tokens``:
        request -> output tokens the step added, for the requests still live when the output
        arrived; ``step``: the step's timing, when measured.
        """
        verified_tokens = 0
        stats, verifying = self.stats, self.verifying
        record, observe = stats.record, self.policy.observe
        for req_id, (phase, chosen) in decisions.items():
            features = verifying.pop(req_id, None) if verifying else None
            counts = counted.get(req_id)
            if counts is not None:
                verified, accepted = counts
                verified_tokens += verified
                record(phase, verified, accepted, tokens.get(req_id) or 0, req_id)
                observe(phase, verified, accepted, req_id)
                if features:
                    self.policy.observe_confidence(phase, features, verified, accepted, req_id)
                continue
            added = tokens.get(req_id)
            if added is None:
                continue  # aborted while the step ran: nothing happened to it
            if chosen == 0 and added:
                record(phase, 0, 0, added, req_id)
                observe(phase, 0, 0, req_id)
            else:
                stats.totals[phase].tokens += added
        if self.labels or self._ended:
            self._count_by_policy(decisions, counted, tokens)
        if step is not None and step.num_requests:
            stats.record_step_time(
                step.seconds, verified_tokens, step.num_requests, step.draft_depth, step.decode_only
            )
            if step.decode_only:
                extra = self._step_context(decisions, counted) if self._contexts is not None else ()
                self.policy.observe_step(step.seconds, verified_tokens, step.num_requests, step.draft_depth, *extra)
                if self._account is not None:
                    self._account(step.seconds, decisions, tokens)

    def _refresh_context(self, req_id: str, at: list, output: int) -> None:
        """The request's context units at ``output`` tokens of output, and when they change next."""
        units, change = context_units_until(at[0] + output)
        self._contexts[req_id] = units
        at[1] = change - at[0]

    def _step_context(self, decisions: Mapping[str, tuple[Phase, int]],
                      counted: Mapping[str, tuple[int, int]]) -> tuple[float, float]:
        """The step's context, and its verified drafts times their requests' contexts."""
        contexts = self._contexts
        if self._ended_contexts:
            contexts = {**contexts, **self._ended_contexts}
            self._ended_contexts.clear()
        get, total, weighted = contexts.get, 0.0, 0.0
        for req_id in decisions:
            c = get(req_id, 0.0)
            total += c
            if (counts := counted.get(req_id)) is not None:
                weighted += counts[0] * c
        return total, weighted

    def _count_by_policy(self, decisions: Mapping[str, tuple[Phase, int]], counted: Mapping[str, tuple[int, int]],
                         tokens: Mapping[str, int]) -> None:
        """``after_output``'s counts again, by policy, for the requests that chose their own
        (vLLM frees a finished request before its last step's output arrives: ``_ended``)."""
        labels = {**self.labels, **self._ended} if self._ended else self.labels
        self._ended.clear()
        record = self.stats.record_policy
        for req_id, (phase, chosen) in decisions.items():
            label = labels.get(req_id)
            if label is None:
                continue
            counts = counted.get(req_id)
            if counts is not None:
                record(label, phase, counts[0], counts[1], tokens.get(req_id) or 0)
            elif (added := tokens.get(req_id)) is not None:
                record(label, phase, 0 if chosen == 0 and added else None, 0, added)

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        self._seen.pop(request_id, None)
        self.plans.pop(request_id, None)
        self.confidences.pop(request_id, None)
        self.verifying.pop(request_id, None)
        self.overrides.pop(request_id, None)
        label = self.labels.pop(request_id, None)
        if label is not None:
            self._ended[request_id] = label
        if self._contexts is not None:
            self._context_at.pop(request_id, None)
            context = self._contexts.pop(request_id, None)
            if context is not None:
                self._ended_contexts[request_id] = context
        self.policy.forget(request_id)

    def prune(self, live_request_ids: Iterable[str]) -> None:
        live = set(live_request_ids)
        for req_id in [r for r in self.states if r not in live]:
            self.forget(req_id)
