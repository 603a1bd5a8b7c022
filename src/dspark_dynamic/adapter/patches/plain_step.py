"""A step that verifies no draft and whose idle drafter is skipped runs as vLLM's plain decoding
step (worker process, Model Runner V1, ``draft_model``).

With speculative decoding configured, vLLM's runner takes its speculative branches on every
step: spec-decode metadata for zero drafts, the drafter's attention metadata, the drafting step
(next tokens, then the proposer, which ``drafter_skip`` cuts short), the KV connector's deferred
finish.  A step in which no request has a draft and the drafter is asked for none, and whose
drafter ``drafter_skip`` lets idle, needs none of them; on the testbed they cost ~0.04 ms of a
3.3 ms step (``scripts/profile_depth0.py --timers``).

``GPUModelRunner._prepare_inputs`` (wrapped): on such a step (``scheduled_spec_decode_tokens``
empty, ``num_spec_tokens_to_schedule == 0``, the drafter's ``DrafterSkip.try_skip`` allows it
for the step's rows, which records their lag exactly as the drafter's own skip would), the
runner's ``speculative_config`` reads None from here until the step's ``sample_tokens`` returns
(``GPUModelRunner.sample_tokens``, wrapped), or until ``execute_model`` returns anything but
None or raises (``GPUModelRunner.execute_model``, wrapped).  vLLM's own plain-decoding branches
then run: the same logits rows (each request's last position), the same sampler, no drafting;
``take_draft_token_ids`` has nothing to hand over, and the scheduler had already cleared every
request's drafts when it scheduled the step.  Tokens, logprobs and the drafter's cache (caught
up later by ``drafter_skip``) are what the speculative branch with no drafts gives.

Limits: only where ``drafter_skip`` is attached (``draft_model``, sync scheduling, no data
parallel), and not for hybrid models (their recurrent state reads an offset the speculative
branch applies) or with a KV connector (its finish is deferred past drafting).  A fault in the
plugin's part restores the runner's config and leaves vLLM's speculative path on for good.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from dspark_dynamic.adapter.build import worker_options
from dspark_dynamic.adapter.fail_open import FailOpen
from dspark_dynamic.adapter.patches.drafter_skip import ATTR as SKIP_ATTR
from dspark_dynamic.adapter.patching import Patch, Where

logger = logging.getLogger("vllm.dspark_dynamic")

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
ATTR = "_dspark_dynamic_plain_step"  # on a runner: True once allowed, None when off (or faulted)
SAVED = "_dspark_dynamic_plain_step_config"  # on a runner: its speculative config while a step runs plain


def _restore(runner: Any, hook: Any = None) -> None:
    saved = runner.__dict__.pop(SAVED, None)
    if saved is not None:
        runner.speculative_config = saved


GUARD = FailOpen(ATTR, release=_restore, fallback="every step takes vLLM's speculative path")


def why_not_plain(runner: Any) -> str | None:
    """Why this runner's idle steps cannot run as plain steps, or None."""
    if getattr(getattr(runner, "drafter", None), "__dict__", {}).get(SKIP_ATTR) is None:
        return "the drafter's idle forward is not skipped"
    if getattr(getattr(runner, "model_config", None), "is_hybrid", True):
        return "a hybrid model (its recurrent state reads the speculative branch's offset)"
    try:
        from vllm.distributed.kv_transfer import has_kv_transfer_group

        if has_kv_transfer_group():
            return "a KV connector (its finish waits for the drafter)"
    except ImportError:
        pass
    return None


def _allowed(runner: Any) -> bool:
    allowed = runner.__dict__.get(ATTR, False)
    if allowed is False:  # not decided yet
        if (getattr(getattr(runner, "drafter", None), "__dict__", {}).get(SKIP_ATTR) is None
                and worker_options(getattr(runner, "vllm_config", None)) is None):
            runner.__dict__[ATTR] = None  # an engine the plugin is not configured for: nothing to say
            return False
        why_not = why_not_plain(runner)
        allowed = runner.__dict__[ATTR] = True if why_not is None else None
        if why_not is None:
            logger.info("dspark_dynamic: steps that verify and draft nothing run vLLM's plain decoding path")
        else:
            logger.info("dspark_dynamic: steps that verify no draft keep vLLM's speculative path (%s)", why_not)
    return allowed is True


def goes_plain(runner: Any, scheduler_output: Any, num_scheduled_tokens: Any) -> bool:
    """This step verifies and drafts nothing and the drafter may stay idle (its lag recorded)."""
    if scheduler_output.scheduled_spec_decode_tokens or getattr(
            scheduler_output, "num_spec_tokens_to_schedule", None) != 0:
        return False
    if not _allowed(runner):
        return False
    skip = getattr(runner.drafter, "__dict__", {}).get(SKIP_ATTR)
    if skip is None:  # detached after a fault
        return False
    return skip.try_skip(None, skip.rows_of(num_scheduled_tokens[: runner.input_batch.num_reqs].tolist()))


def _prepare_inputs(original):
    where = "GPUModelRunner._prepare_inputs"

    @functools.wraps(original)
    def _prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: Any, *args: Any, **kwargs: Any):
        state = self.__dict__
        if SAVED in state:  # a step that never reached sample_tokens
            _restore(self)
        if state.get(ATTR, False) is not None:
            try:
                plain = goes_plain(self, scheduler_output, num_scheduled_tokens)
            except Exception as exc:
                GUARD.trip(self, where, exc)
                plain = False
            if plain:
                state[SAVED] = self.speculative_config
                self.speculative_config = None
        return original(self, scheduler_output, num_scheduled_tokens, *args, **kwargs)

    return _prepare_inputs


def _execute_model(original):
    @functools.wraps(original)
    def execute_model(self: Any, *args: Any, **kwargs: Any):
        try:
            result = original(self, *args, **kwargs)
        except BaseException:
            _restore(self)
            raise
        if result is not None:  # no sample_tokens follows
            _restore(self)
        return result

    return execute_model


def _sample_tokens(original):
    @functools.wraps(original)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any):
        try:
            return original(self, *args, **kwargs)
        finally:
            _restore(self)

    return sample_tokens


R = "v1/worker/gpu_model_runner.py"
REMOVABLE = "vLLM's runner takes its plain branches on a step with no drafts and an idle drafter"

PATCHES = (
    Patch(
        "plain-step-prepare",
        RUNNER_MODULE,
        "GPUModelRunner._prepare_inputs",
        _prepare_inputs,
        params=("scheduler_output", "num_scheduled_tokens"),
        why="a step that verifies and drafts nothing, with its drafter idle, takes vLLM's plain decoding branches",
        process="worker",
        where=Where(f"{R}:1889 (branch :2153)", f"{R}:1920 (branch :2184)", f"{R}:1924 (branch :2188)",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when=REMOVABLE,
    ),
    Patch(
        "plain-step-execute",
        RUNNER_MODULE,
        "GPUModelRunner.execute_model",
        _execute_model,
        params=("scheduler_output",),
        why="a plain step's speculative config is restored when no sample_tokens follows",
        process="worker",
        where=Where(f"{R}:4044", f"{R}:3940", f"{R}:3906",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when=REMOVABLE,
    ),
    Patch(
        "plain-step-sample",
        RUNNER_MODULE,
        "GPUModelRunner.sample_tokens",
        _sample_tokens,
        params=("grammar_output",),
        why="a plain step's speculative config is restored once its tokens are sampled",
        process="worker",
        where=Where(f"{R}:4423", f"{R}:4304", f"{R}:4270",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when=REMOVABLE,
    ),
)
