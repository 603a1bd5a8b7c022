"""The depth controller inside vLLM's engine-core scheduler.

``Scheduler.__init__`` attaches a ``DepthController`` when ``additional_config`` holds
``dspark_dynamic`` options (otherwise nothing changes).  ``schedule`` trims each running
request's drafts before the original runs, so vLLM schedules 1+k tokens, allocates KV for
them, and its rejection accounting, metrics and the worker inputs all see k.  The async
scheduler inherits these methods.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from typing import Any

from dspark_dynamic.configure import (
    raw_options,
    reasoning_parser_of,
    resolve_batch_depth,
    resolve_options,
)
from dspark_dynamic.controller import DepthController
from dspark_dynamic.metrics import SnapshotWriter
from dspark_dynamic.patching import Patch
from dspark_dynamic.policy import PhasePolicy
from dspark_dynamic.stats import PhaseStats

logger = logging.getLogger("vllm.dspark_dynamic")

MODULE = "vllm.v1.core.sched.scheduler"
ATTR = "_dspark_dynamic"
_MAX_PENDING = 16  # scheduled-but-not-yet-updated steps kept (async scheduling keeps 1-2)

# The most recently built controller of this process (tests, benchmarks, the metrics bridge).
_latest: "SchedulerHook | None" = None


def latest_controller() -> "SchedulerHook | None":
    return _latest


def build_policy(options: Any) -> Any:
    if options.policy == "adaptive":
        from dspark_dynamic.adaptive import AdaptivePolicy

        return AdaptivePolicy.from_options(options)
    return PhasePolicy(options.reasoning_depth, options.answer_depth)


class SchedulerHook:
    """What one scheduler instance carries: controller, pending decisions, log timer."""

    def __init__(self, vllm_config: Any, scheduler_cls: str) -> None:
        self.scheduler_cls = scheduler_cls  # which vLLM scheduler class it sits in (reports)
        spec = vllm_config.speculative_config
        options, markers = resolve_options(
            raw_options(vllm_config.additional_config),
            getattr(spec, "num_speculative_tokens", None),
            reasoning_parser_of(vllm_config),
            vllm_config.model_config,
        )
        self.options = options
        self.trace = open(options.trace_path, "a", buffering=1) if options.trace_path else None
        self.controller = DepthController(
            markers.rules(),
            build_policy(options),
            resolve_batch_depth(options, vllm_config),
            PhaseStats(self.trace),
        )
        self.pending: OrderedDict[int, dict] = OrderedDict()
        self.metrics = SnapshotWriter()
        self.last_log = time.monotonic()
        logger.info(
            "dspark_dynamic: depth controller on (method=%s, num_speculative_tokens=%d, "
            "policy=%s, reasoning_depth=%d, answer_depth=%d, batch_depth=%s; markers: %s)",
            getattr(spec, "method", None),
            options.num_speculative_tokens,
            options.policy,
            options.reasoning_depth,
            options.answer_depth,
            self.controller.batch_depth.value,
            markers.source,
        )

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


def _init(original):
    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        global _latest
        if raw_options(getattr(self.vllm_config, "additional_config", None)) is None:
            self.__dict__[ATTR] = None
            return
        hook = SchedulerHook(self.vllm_config, type(self).__name__)
        self.__dict__[ATTR] = hook
        _latest = hook

    return __init__


def _schedule(original):
    @functools.wraps(original)
    def schedule(self, *args: Any, **kwargs: Any):
        hook = self.__dict__.get(ATTR)
        if hook is None:
            return original(self, *args, **kwargs)
        decisions = hook.controller.before_schedule(self.running)
        output = original(self, *args, **kwargs)
        pending = hook.pending
        pending[id(output)] = decisions
        while len(pending) > _MAX_PENDING:
            pending.popitem(last=False)
        return output

    return schedule


def _update_from_output(original):
    @functools.wraps(original)
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any, *args: Any, **kwargs: Any):
        hook = self.__dict__.get(ATTR)
        if hook is None:
            return original(self, scheduler_output, model_runner_output, *args, **kwargs)
        controller = hook.controller
        decisions = hook.pending.pop(id(scheduler_output), None)
        generated = (
            controller.generated_counts(
                decisions, model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
            )
            if decisions
            else {}
        )
        result = original(self, scheduler_output, model_runner_output, *args, **kwargs)
        if decisions:
            kept = controller.generated_counts(  # vLLM cut the lists at stop tokens, in place
                decisions, model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
            )
            controller.after_output(decisions, generated, scheduler_output.scheduled_spec_decode_tokens, kept)
        if len(controller.states) > len(self.requests):
            controller.prune(self.requests)
        hook.metrics.write(controller.stats.snapshot, force=not self.running)
        hook.maybe_log()
        return result

    return update_from_output


def _free_request(original):
    @functools.wraps(original)
    def _free_request(self, request: Any, *args: Any, **kwargs: Any):
        hook = self.__dict__.get(ATTR)
        if hook is not None:
            hook.controller.forget(request.request_id)
        return original(self, request, *args, **kwargs)

    return _free_request


PATCHES = (
    Patch(
        "scheduler-init",
        MODULE,
        "Scheduler.__init__",
        _init,
        params=("vllm_config",),
        why="attach the depth controller when dspark_dynamic is configured",
    ),
    Patch(
        "scheduler-schedule",
        MODULE,
        "Scheduler.schedule",
        _schedule,
        why="trim request.spec_token_ids to the chosen depth before scheduling",
    ),
    Patch(
        "scheduler-update-from-output",
        MODULE,
        "Scheduler.update_from_output",
        _update_from_output,
        params=("scheduler_output", "model_runner_output"),
        why="per-phase verified/accepted counts, periodic log line",
    ),
    Patch(
        "scheduler-free-request",
        MODULE,
        "Scheduler._free_request",
        _free_request,
        params=("request",),
        why="drop a finished request's phase state",
    ),
)
