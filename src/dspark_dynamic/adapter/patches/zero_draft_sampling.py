"""A step that verifies no draft: vLLM's plain sampler, and its metadata built without the
draft machinery (worker process, Model Runner V1).

With speculative decoding configured, vLLM's runner sends every step through its rejection
sampler, also a step in which no request has a draft (the controller chose depth 0 for all of
them).  There the rejection sampler runs its sampler over each request's one logits row (the
"bonus" token) and then its draft machinery over empty tensors; on the CPU testbed that is about
0.2 ms of a 12 ms step, every step the controller drafts nothing.

``GPUModelRunner._sample`` (wrapped): when the step's ``SpecDecodeMetadata`` has
``max_spec_len == 0``, vLLM's own call runs with no metadata, i.e. its plain-decoding branch:
the same logits rows (one per request: with no drafts vLLM's logits indices are each request's
last position), the same sampler and sampling metadata, the same ``[requests, 1]`` int32 output.
What the rejection sampler adds at zero drafts is nothing a token depends on:
- the sampled token is the sampler's sample of the same row in both (greedy, random, seeded);
- penalties see the request's output tokens plus its drafts for the step: none;
- logprobs are the sampler's logprobs of the row, as plain decoding reports them.

``GPUModelRunner._calc_spec_decode_metadata`` (wrapped): when no request has a draft, the
metadata is what vLLM's computes for all-zero draft counts, written out: one sampled token per
request at its last scheduled position (``logits_indices = cu_num_scheduled_tokens - 1``), bonus
indices ``0..n-1``, zero draft counts, no target indices or draft ids, in vLLM's dtypes.  vLLM's
general form (cumulative sums, a repeat, two gathers over the batch's input ids) costs ~0.05 ms
of host time on the testbed, every step that verifies nothing.  A unit test compares both on
random batches.

Sync scheduling only: under async scheduling vLLM's speculative branch also refreshes the
batch's draft ids from the previous step before sampling, which this leaves alone.  Nothing
happens unless ``additional_config`` holds ``dspark_dynamic`` options.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from dspark_dynamic.adapter.build import worker_options
from dspark_dynamic.adapter.patching import Patch, Where

logger = logging.getLogger("vllm.dspark_dynamic")

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
ATTR = "_dspark_dynamic_zero_draft_plain"  # on a runner: True / False once decided


def plain_sampling_wanted(runner: Any) -> bool:
    """The plugin is configured for this runner and it schedules synchronously."""
    if getattr(runner, "use_async_scheduling", True):
        return False
    return worker_options(getattr(runner, "vllm_config", None)) is not None


def _decide(runner: Any) -> bool:
    try:
        wanted = plain_sampling_wanted(runner)
    except Exception as exc:  # an unknown runner: vLLM's own path
        logger.warning("dspark_dynamic: zero-draft steps keep vLLM's rejection sampler (%r)", exc)
        wanted = False
    runner.__dict__[ATTR] = wanted
    if wanted:
        logger.info("dspark_dynamic: steps that verify no draft are sampled by vLLM's plain sampler")
    return wanted


def _sample(original):
    @functools.wraps(original)
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any, *args: Any, **kwargs: Any):
        if spec_decode_metadata is not None:
            wanted = self.__dict__.get(ATTR)
            if wanted is None:
                wanted = _decide(self)
            # getattr: a metadata without the field (an unknown vLLM) keeps vLLM's own path
            if wanted and getattr(spec_decode_metadata, "max_spec_len", None) == 0:
                return original(self, logits, None, *args, **kwargs)
        return original(self, logits, spec_decode_metadata, *args, **kwargs)

    return _sample


def zero_draft_metadata(runner: Any, num_draft_tokens: Any, cu_num_scheduled_tokens: Any) -> Any:
    """vLLM's ``SpecDecodeMetadata`` for a step in which no request has a draft."""
    import numpy as np
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    n = len(num_draft_tokens)
    device = runner.device
    cached = runner.__dict__.get(CACHE)
    if cached is None or cached[0] != n:
        sampled = torch.arange(1, n + 1, dtype=torch.int32, device=device)
        cached = runner.__dict__[CACHE] = (
            n, sampled, sampled - 1, torch.zeros(n, dtype=torch.int32, device=device),
            torch.empty(0, dtype=torch.int32, device=device),
            torch.empty(0, dtype=runner.input_ids.gpu.dtype, device=device), [0] * n,
        )
    _n, cu_sampled, bonus, cu_draft, targets, draft_ids, zeros = cached
    logits = torch.from_numpy(np.asarray(cu_num_scheduled_tokens, dtype=np.int32) - 1).to(device)
    return SpecDecodeMetadata(
        draft_token_ids=draft_ids,
        num_draft_tokens=list(zeros),
        cu_num_draft_tokens=cu_draft,
        cu_num_sampled_tokens=cu_sampled,
        target_logits_indices=targets,
        bonus_logits_indices=bonus,
        logits_indices=logits,
    )


CACHE = "_dspark_dynamic_zero_draft_metadata"  # on a runner: (n, tensors...) for n requests


def _calc_spec_decode_metadata(original):
    @functools.wraps(original)
    def _calc_spec_decode_metadata(self: Any, num_draft_tokens: Any, cu_num_scheduled_tokens: Any,
                                   *args: Any, **kwargs: Any):
        if not args and not kwargs and not num_draft_tokens.any():
            wanted = self.__dict__.get(ATTR)
            if wanted is None:
                wanted = _decide(self)
            if wanted:
                try:
                    return zero_draft_metadata(self, num_draft_tokens, cu_num_scheduled_tokens)
                except Exception as exc:  # an unknown runner or metadata: vLLM's own path from now on
                    self.__dict__[ATTR] = False
                    logger.warning("dspark_dynamic: zero-draft steps keep vLLM's own metadata and sampler (%r)", exc)
        return original(self, num_draft_tokens, cu_num_scheduled_tokens, *args, **kwargs)

    return _calc_spec_decode_metadata


R = "v1/worker/gpu_model_runner.py"

PATCHES = (
    Patch(
        "zero-draft-plain-sampler",
        RUNNER_MODULE,
        "GPUModelRunner._sample",
        _sample,
        params=("logits", "spec_decode_metadata"),
        why="a step that verifies no draft is sampled by the plain sampler, not the rejection sampler",
        process="worker",
        where=Where(f"{R}:3570 (plain branch :3580)", f"{R}:3437 (plain branch :3447)", f"{R}:3403 (plain branch :3413)",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when="vLLM's runner takes its plain branch when no request has a draft",
    ),
    Patch(
        "zero-draft-spec-metadata",
        RUNNER_MODULE,
        "GPUModelRunner._calc_spec_decode_metadata",
        _calc_spec_decode_metadata,
        params=("num_draft_tokens", "cu_num_scheduled_tokens"),
        why="a step that verifies no draft gets its (trivial) spec-decode metadata without the draft machinery",
        process="worker",
        where=Where(f"{R}:2742 (called :2183)", f"{R}:2625 (called :2223)", f"{R}:2591 (called :2227)",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when="vLLM's runner takes its plain branch when no request has a draft",
    ),
)
