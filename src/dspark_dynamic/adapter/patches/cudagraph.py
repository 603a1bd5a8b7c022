"""FULL decode CUDA graphs for every verify length the controller can produce (Model Runner V2).

vLLM's target ``ModelCudaGraphManager`` captures uniform FULL decode graphs only for query
length ``1 + N``.  A step in which the controller verifies k < N drafts has length ``1 + k``
and, under ``FULL_DECODE_ONLY``, would run eagerly (on Lvllm that means a GPU sync per CPU MoE
layer).  This adapter adds uniform FULL decode descriptors for each extra length ``L = 1 + k``
(``L = 1`` when a depth is 0), for request counts 1..``max_num_seqs`` (every count up to 8,
then vLLM's capture sizes rounded to L), after vLLM built its own.  vLLM 0.34 captures uniform
decode graphs for every query length in the manager's ``decode_max_reqs`` itself (its dynamic
SD uses that); there the patch adds the verify lengths to that map before vLLM builds its
descriptors and dispatch tables, with vLLM's own request-count grid.

Invariants:
- only the target's ``ModelCudaGraphManager`` is patched (an override on that subclass); the
  drafter's managers (other ``CudaGraphManager`` subclasses) are untouched;
- vLLM's descriptor lists are never mutated in place: the fork shares one candidate list
  between all token counts of a bucket, so every changed entry gets a new list;
- nothing changes unless ``additional_config`` holds ``dspark_dynamic``, the mode has a
  separate FULL decode routine, and the manager does not already capture varlen decode graphs
  (vLLM 0.33 with adaptive verification: those replay any 1..1+N mix already).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from dspark_dynamic.adapter.build import raw_options
from dspark_dynamic.core.options import parse_options
from dspark_dynamic.adapter.patching import Patch, Where

logger = logging.getLogger("vllm.dspark_dynamic")

MODULE = "vllm.v1.worker.gpu.cudagraph_utils"
DENSE_REQUEST_COUNTS = 8  # every request count up to this gets its own graph


def controller_depths(vllm_config: Any) -> set[int]:
    """Depths the configured controller may pick (empty when it is not configured)."""
    raw = raw_options(getattr(vllm_config, "additional_config", None))
    spec = getattr(vllm_config, "speculative_config", None)
    n = getattr(spec, "num_speculative_tokens", None)
    if raw is None or not n:
        return set()
    options = parse_options(raw, n)
    if options.learns_depth:
        return set(range(options.adaptive.min_depth if options.policy == "adaptive" else 0, n + 1))
    return {options.reasoning_depth, options.answer_depth}


def request_counts(length: int, max_reqs: int, capture_sizes: list[int], max_tokens: int) -> list[int]:
    counts = set(range(1, min(max_reqs, DENSE_REQUEST_COUNTS) + 1))
    counts |= {-(-size // length) for size in capture_sizes}
    return sorted(r for r in counts if 1 <= r <= max_reqs and r * length <= max_tokens)


def extra_decode_descriptors(manager: Any, lengths: list[int]) -> list[Any]:
    """Uniform FULL decode descriptors for ``lengths`` that ``manager`` does not have yet."""
    mode = manager.cudagraph_mode
    decode_mode = mode.decode_mode() if mode else None
    if not lengths or not mode or not mode.separate_routine() or not decode_mode:
        return []
    if getattr(manager, "varlen_decode", False):
        return []
    compilation = manager.compilation_config
    sizes = sorted(compilation.cudagraph_capture_sizes or [])
    if not sizes:
        return []
    max_tokens = getattr(compilation, "max_cudagraph_capture_size", None) or sizes[-1]
    existing = manager._capture_descs.get(decode_mode, [])
    desc_cls = type(existing[0]) if existing else _descriptor_class()
    fields = {f.name for f in dataclasses.fields(desc_cls)}
    lora_cases = getattr(manager, "lora_capture_cases", None) or [0]
    out = []
    for length in lengths:
        for r in request_counts(length, manager.max_num_reqs, sizes, max_tokens):
            for loras in lora_cases if "num_active_loras" in fields else [None]:
                kwargs = dict(cg_mode=decode_mode, num_tokens=r * length, num_reqs=r, uniform_token_count=length)
                if loras is not None:
                    kwargs["num_active_loras"] = loras
                desc = desc_cls(**kwargs)
                if desc not in existing and desc not in out:
                    out.append(desc)
    return out


def _descriptor_class() -> Any:
    import importlib

    return importlib.import_module(MODULE).BatchExecutionDescriptor


def add_descriptors(manager: Any, descs: list[Any]) -> None:
    """Register ``descs`` for capture and dispatch without mutating vLLM's lists."""
    if not descs:
        return
    decode_mode = descs[0].cg_mode
    manager._capture_descs = dict(manager._capture_descs)
    manager._capture_descs[decode_mode] = sorted(
        list(manager._capture_descs.get(decode_mode, [])) + descs, key=lambda d: d.num_tokens, reverse=True
    )
    candidates = manager._candidates
    by_key: dict[Any, list[Any]] = {}
    # Each desc serves token counts above the previous desc of the same (length, loras) group.
    groups: dict[tuple, list[Any]] = {}
    for d in descs:
        groups.setdefault((d.uniform_token_count, getattr(d, "num_active_loras", 0)), []).append(d)
    for (_, loras), group in groups.items():
        group.sort(key=lambda d: d.num_tokens)
        start = 1
        for d in group:
            for i in range(start, d.num_tokens + 1):
                key = (i, loras) if isinstance(candidates, dict) else i
                by_key.setdefault(key, []).append(d)
            start = d.num_tokens + 1
    if isinstance(candidates, dict):  # vLLM >= 0.32: {(num_tokens, loras): [desc, ...]}
        new = dict(candidates)
        for key, extra in by_key.items():
            new[key] = extra + list(candidates.get(key, []))
    else:  # the fork: list indexed by num_tokens, one list object shared per bucket
        size = max([len(candidates)] + [k + 1 for k in by_key])
        new = [list(candidates[i]) if i < len(candidates) else [] for i in range(size)]
        for key, extra in by_key.items():
            new[key] = extra + new[key]
    manager._candidates = new


def verify_lengths(manager: Any) -> list[int]:
    """Decode query lengths the controller can produce besides vLLM's widest (1 + N)."""
    depths = controller_depths(manager.vllm_config)
    if not depths:
        return []
    spec_tokens = manager.vllm_config.speculative_config.num_speculative_tokens
    sampled = max(1, manager.decode_query_len - spec_tokens)
    return sorted({k + sampled for k in depths} - {manager.decode_query_len})


def _add_query_lengths(manager: Any, original: Any, *args: Any, **kwargs: Any) -> None:
    """vLLM >= 0.34: put the verify lengths into ``decode_max_reqs`` (a new dict), then let
    vLLM build the graphs and per-length dispatch tables.  Nothing with varlen decode graphs."""
    query_lens = manager.decode_max_reqs
    lengths = [] if manager.varlen_decode else [n for n in verify_lengths(manager) if n not in query_lens]
    if lengths:
        manager.decode_max_reqs = dict(sorted({**query_lens, **dict.fromkeys(lengths, manager.max_num_reqs)}.items()))
    original(manager, *args, **kwargs)
    added = [d for descs in manager._capture_descs.values() for d in descs if d.uniform_token_count in lengths]
    if added:
        logger.info("dspark_dynamic: %d extra FULL decode CUDA graphs for verify lengths %s", len(added), lengths)


def _init_candidates(original):
    @functools.wraps(original)
    def _init_candidates(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(getattr(self, "decode_max_reqs", None), dict):  # vLLM >= 0.34
            return _add_query_lengths(self, original, *args, **kwargs)
        original(self, *args, **kwargs)
        lengths = verify_lengths(self)
        if not lengths:
            return
        descs = extra_decode_descriptors(self, lengths)
        add_descriptors(self, descs)
        if descs:
            logger.info(
                "dspark_dynamic: %d extra FULL decode CUDA graphs for verify lengths %s",
                len(descs),
                lengths,
            )

    return _init_candidates


PATCHES = (
    Patch(
        "cudagraph-decode-lengths",
        MODULE,
        "ModelCudaGraphManager._init_candidates",
        _init_candidates,
        why="FULL decode graphs for every verify length 1+k the controller can choose",
        process="GPU worker (Model Runner V2)",
        where=Where(
            "v1/worker/gpu/cudagraph_utils.py:147 (base), class :331; candidates: a list indexed by "
            "num_tokens, lists shared per bucket",
            "v1/worker/gpu/cudagraph_utils.py:251; candidates: dict[(num_tokens, loras)]",
            "v1/worker/gpu/cudagraph_utils.py:256; with adaptive verification vLLM captures varlen "
            "graphs itself and the patch adds nothing",
            v034="v1/worker/gpu/cudagraph_utils.py:289 (base), class :635; graphs per query length of "
            "decode_max_reqs (:185), dispatch tables _decode_descs: the patch adds the verify lengths "
            "there; nothing with adaptive verification",
        ),
        removable_when="vLLM captures graphs per verify length (its dynamic SD does so for batch-size schedules only)",
    ),
)
