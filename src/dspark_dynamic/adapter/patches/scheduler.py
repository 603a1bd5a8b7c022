"""The depth controller inside vLLM's engine-core scheduler (applied in the engine-core process).

``Scheduler.__init__`` attaches a ``DepthController`` when ``additional_config`` holds
``dspark_dynamic`` options (otherwise nothing changes).  ``schedule`` trims each running
request's drafts before the original runs, so vLLM schedules 1+k tokens, allocates KV for
them, and its rejection accounting, metrics and the worker inputs all see k.
``_update_after_schedule`` (called at the end of ``schedule``, before the async scheduler makes
its placeholders) plans every scheduled request's next depth and lowers
``SchedulerOutput.num_spec_tokens_to_schedule`` to the deepest plan, so the drafter drafts no
more than will be verified.  The async scheduler inherits these methods.

Every wrapper is built by ``GUARD`` (``adapter/fail_open.py``): the plugin's part of each method
runs guarded, and a fault in it detaches the controller from this scheduler (vLLM's own
behaviour, full depth, from then on), logs once with the traceback and counts it
(``dspark_dynamic:controller_errors_total``).

Removable when vLLM has a per-request draft-depth hook in its scheduler.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from dspark_dynamic.adapter.build import build_controller
from dspark_dynamic.adapter.fail_open import FailOpen
from dspark_dynamic.adapter.metrics import SnapshotWriter, engine_label
from dspark_dynamic.adapter.patching import Patch, Where
from dspark_dynamic.core.controller import StepTiming

logger = logging.getLogger("vllm.dspark_dynamic")

MODULE = "vllm.v1.core.sched.scheduler"
ATTR = "_dspark_dynamic"
_MAX_PENDING = 16  # scheduled-but-not-yet-updated steps kept (async scheduling keeps 1-2)

# The most recently built controller of this process (tests, benchmarks, the metrics bridge).
_latest: "SchedulerHook | None" = None


def latest_controller() -> "SchedulerHook | None":
    return _latest


class SchedulerHook:
    """What one scheduler instance carries: controller, pending decisions, log timer."""

    def __init__(self, built: Any, scheduler_cls: str, engine: str = "0") -> None:
        self.scheduler_cls = scheduler_cls  # which vLLM scheduler class it sits in (reports)
        self.options = built.options
        self.markers_source = built.markers.source  # how the phase is followed (reports)
        self.controller = built.controller
        self.pending: OrderedDict[int, tuple[dict, float]] = OrderedDict()  # output id -> decisions, start
        self.counted: dict[str, tuple[int, int]] | None = None  # this update's (verified, accepted) per request
        self.last_update_end = 0.0
        self.metrics = SnapshotWriter(engine=engine)  # engine: vLLM's engine index, the label on /metrics
        self.last_log = time.monotonic()

    def maybe_log(self) -> None:
        interval = self.options.log_interval_s
        now = time.monotonic()
        if interval <= 0 or now - self.last_log < interval:
            return
        self.last_log = now
        describe = getattr(self.controller.policy, "describe", None)
        extra = {p: describe(p) for p in self.controller.stats.totals} if describe else None
        for line in self.controller.stats.interval_lines(extra):
            logger.info(line)
        estimate = getattr(self.controller.policy, "estimate", None)
        overall = (estimate() or {}).get("all") if estimate is not None else None
        if overall:
            logger.info("dspark_dynamic: estimated speed-up overall %.2fx plain decoding, %.2fx the fixed depth "
                        "%d (learned step costs and acceptance)", overall["plain"], overall["fixed"],
                        self.options.num_speculative_tokens)

    def publish(self, force: bool = False) -> None:
        """Hand the counters to ``/metrics`` (throttled unless ``force``)."""
        controller = self.controller
        tracked = len(controller.states)
        if force or self.metrics.due(tracked):
            self.metrics.write(self.snapshot, force=force, tracked=tracked, errors=GUARD.errors,
                               estimate=getattr(controller.policy, "estimate", None),
                               policies=controller.stats.policy_snapshot)

    def snapshot(self) -> dict:
        """Per phase: the counters, and the draft-confidence calibration where the policy has one."""
        phases = self.controller.stats.snapshot()
        calibrators = getattr(self.controller.policy, "calibrators", None)
        if calibrators and getattr(self.controller.policy, "confidence_seen", False):
            for phase, calibrator in calibrators.items():
                phases[phase.label].update(calibrator.report.metric_fields())
        return phases

    def detach(self) -> None:
        """After a fault: drop per-request state, stop the trace, publish the final counts (each
        step on its own: the fault may strike again in any of them)."""
        controller = self.controller
        for step in (lambda: controller.prune(()), controller.states.clear, controller.stats.stop_trace):
            try:
                step()
            except Exception as exc:
                logger.debug("dspark_dynamic: while detaching: %r", exc)
        self.publish(force=True)


def attach(scheduler: Any) -> None:
    """Build the controller for ``scheduler`` and attach it (nothing when not configured)."""
    global _latest
    built = build_controller(scheduler.vllm_config)
    if built is None:
        return
    logger.info(built.describe(getattr(scheduler.vllm_config.speculative_config, "method", None)))
    hook = SchedulerHook(built, type(scheduler).__name__, engine_label(scheduler.vllm_config))
    scheduler.__dict__[ATTR] = hook
    _latest = hook


def _release(scheduler: Any, hook: "SchedulerHook | None") -> None:
    if hook is None:  # the fault struck while attaching: publish the count alone
        SnapshotWriter(engine=engine_label(getattr(scheduler, "vllm_config", None))).write(
            dict, force=True, errors=GUARD.errors)
    else:
        hook.detach()


GUARD = FailOpen(ATTR, _release, fallback="vLLM's own speculative decoding continues at the full configured depth")


def _init(original):
    return GUARD.wrap_init(original, attach)


def _before_schedule(hook: SchedulerHook, scheduler: Any, *args: Any, **kwargs: Any):
    started = time.monotonic()
    return hook.controller.before_schedule(scheduler.running), started


def _after_schedule(hook: SchedulerHook, scheduler: Any, ctx: tuple, output: Any, *args: Any, **kwargs: Any) -> None:
    pending = hook.pending
    pending[id(output)] = ctx
    while len(pending) > _MAX_PENDING:
        pending.popitem(last=False)


def _schedule(original):
    return GUARD.wrap(original, _before_schedule, _after_schedule)


def _before_update(hook: SchedulerHook, scheduler: Any, scheduler_output: Any, *args: Any, **kwargs: Any):
    decisions, started = hook.pending.pop(id(scheduler_output), (None, 0.0))
    requests = scheduler.requests
    # Requests still live when the step's output arrives (an abort while the step was in flight
    # removed the others; vLLM counts nothing for them either), with their output length.
    before = {}
    for req_id in decisions or ():
        request = requests.get(req_id)
        if request is not None and not request.is_finished():
            before[req_id] = (request, len(request.output_token_ids))
    hook.counted = {}
    return decisions, started, before


def _after_update(hook: SchedulerHook, scheduler: Any, ctx: tuple, result: Any, scheduler_output: Any,
                  *args: Any, **kwargs: Any) -> None:
    decisions, started, before = ctx
    counted, hook.counted = hook.counted, None
    controller = hook.controller
    if decisions:
        tokens = {req_id: len(request.output_token_ids) - n for req_id, (request, n) in before.items()}
        step = step_timing(scheduler_output, time.monotonic() - max(started, hook.last_update_end))
        controller.after_output(decisions, counted, tokens, step)
    requests = scheduler.requests
    if len(controller.states) > len(requests):
        controller.prune(requests)
    idle = not scheduler.running
    hook.publish(force=idle)
    if idle:
        controller.stats.close()  # the trace's buffered rows, while nothing waits on the engine
    hook.maybe_log()
    hook.last_update_end = time.monotonic()


def _update_from_output(original):
    return GUARD.wrap(original, _before_update, _after_update)


def _count(hook: SchedulerHook, scheduler: Any, spec_decoding_stats: Any, num_draft_tokens: int,
           num_accepted_tokens: int, num_invalid_spec_tokens: Any, request_id: str, *args: Any, **kwargs: Any) -> None:
    counted = hook.counted
    if counted is not None and num_draft_tokens:
        invalid = num_invalid_spec_tokens.get(request_id, 0) if num_invalid_spec_tokens else 0
        counted[request_id] = (num_draft_tokens - invalid, num_accepted_tokens)


def _make_spec_decoding_stats(original):
    return GUARD.wrap(original, _count)


def step_timing(scheduler_output: Any, seconds: float) -> StepTiming:
    """The step's busy time (from ``schedule`` or the previous update, whichever came later) and
    shape; a step in which any request prefilled is not decode-only."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    scheduled = scheduler_output.num_scheduled_tokens
    # every request is scheduled at least its drafts and one token: all exactly that, or a prefill
    decode_only = sum(scheduled.values()) == len(scheduled) + (sum(map(len, spec.values())) if spec else 0)
    return StepTiming(seconds, decode_only, len(scheduled), getattr(scheduler_output, "num_spec_tokens_to_schedule", -1))


def _bound_drafts(hook: SchedulerHook, scheduler: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> None:
    if not (hook.options.bound_drafts and scheduler.num_spec_tokens):
        return
    requests = scheduler.requests
    drafting = (  # every scheduled request but a prefill chunk (those do not draft)
        request
        for req_id, n in scheduler_output.num_scheduled_tokens.items()
        if (request := requests[req_id]).num_computed_tokens + n >= request.num_tokens
    )
    bound = hook.controller.plan_drafts(drafting)
    if bound is not None and bound < scheduler_output.num_spec_tokens_to_schedule:
        scheduler_output.num_spec_tokens_to_schedule = bound  # fewer drafts: valid even if a fault follows


def _update_after_schedule(original):
    return GUARD.wrap(original, _bound_drafts)


def _forget(hook: SchedulerHook, scheduler: Any, request: Any, *args: Any, **kwargs: Any) -> None:
    hook.controller.forget(request.request_id)


def _after_free(hook: SchedulerHook, scheduler: Any, ctx: None, result: Any, *args: Any, **kwargs: Any) -> None:
    if not scheduler.requests:  # idle now (e.g. the last client went away): publish the final state
        hook.publish(force=True)


def _free_request(original):
    return GUARD.wrap(original, _forget, _after_free)


S = "v1/core/sched/scheduler.py"

PATCHES = (
    Patch(
        "scheduler-init",
        MODULE,
        "Scheduler.__init__",
        _init,
        params=("vllm_config",),
        why="attach the depth controller when dspark_dynamic is configured",
        process="engine core",
        where=Where(f"{S}:68", f"{S}:85", f"{S}:87", v034=f"{S}:87"),
        removable_when="vLLM has a per-request draft-depth hook in its scheduler",
    ),
    Patch(
        "scheduler-schedule",
        MODULE,
        "Scheduler.schedule",
        _schedule,
        why="trim request.spec_token_ids to the chosen depth before scheduling",
        process="engine core",
        where=Where(f"{S}:469 (spec slice :673-688)", f"{S}:591 (spec slice :861-876)", f"{S}:699 (spec slice :1010-1025)",
                    v034=f"{S}:716 (spec slice :1026-1041); gained throttle_prefills=False"),
        removable_when="same as scheduler-init",
    ),
    Patch(
        "scheduler-update-from-output",
        MODULE,
        "Scheduler.update_from_output",
        _update_from_output,
        params=("scheduler_output", "model_runner_output"),
        why="per-phase verified/accepted counts, periodic log line",
        process="engine core",
        where=Where(f"{S}:1565 (accounting :1643-1668)", f"{S}:2026 (accounting :2110-2135)", f"{S}:2259 (accounting :2346-2380)",
                    v034=f"{S}:2301 (accounting :2392-2426)"),
        removable_when="vLLM reports spec-decode stats per request phase",
    ),
    Patch(
        "scheduler-spec-decoding-stats",
        MODULE,
        "Scheduler.make_spec_decoding_stats",
        _make_spec_decoding_stats,
        params=("num_draft_tokens", "num_accepted_tokens", "num_invalid_spec_tokens", "request_id"),
        why="count each request-step's verified/accepted drafts exactly where vLLM's own spec-decode stats do",
        process="engine core",
        where=Where(f"{S}:2328 (called :1664)", f"{S}:2961", f"{S}:3305 (called :2365)", v034=f"{S}:3439 (called :2411)"),
        removable_when="vLLM reports spec-decode stats per request phase",
    ),
    Patch(
        "scheduler-update-after-schedule",
        MODULE,
        "Scheduler._update_after_schedule",
        _update_after_schedule,
        params=("scheduler_output",),
        why="plan next-step depths; draft no deeper than the deepest plan (num_spec_tokens_to_schedule)",
        process="engine core",
        where=Where(f"{S}:1233 (K :1161-1183); MRv2 ignores the field, DSpark drafts N in one pass", f"{S}:1616 (K :1486); MRv1 drafters take it as num_speculative_tokens", f"{S}:1845 (K :1710); MRv2 EAGLE/MTP speculators draft that many",
                    v034=f"{S}:1899 (K :1765; AsyncScheduler's override, async_scheduler.py:18, sizes its placeholders from it); MRv2 EAGLE/MTP speculators (target_dependent_ar) draft that many"),
        removable_when="vLLM sizes drafting from per-request depths (its dynamic SD only maps batch size to K)",
    ),
    Patch(
        "scheduler-free-request",
        MODULE,
        "Scheduler._free_request",
        _free_request,
        params=("request",),
        why="drop a finished request's phase state",
        process="engine core",
        where=Where(f"{S}:2142", f"{S}:2714", f"{S}:3031", v034=f"{S}:3170"),
        removable_when="same as scheduler-init",
    ),
)
