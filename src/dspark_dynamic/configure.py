"""Turn a raw ``dspark_dynamic`` dict plus vLLM's config into resolved options (adapter room).

Shared by the process that parses arguments (errors surface before the engine starts) and by
the engine-core scheduler (for configs built without ``EngineArgs``).  After resolution the
options carry explicit marker ids, so the engine core needs no tokenizer.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from dspark_dynamic.markers import ResolvedMarkers, resolve_markers
from dspark_dynamic.options import CONFIG_KEY, DynamicDepthOptions, parse_options
from dspark_dynamic.policy import BatchDepth

logger = logging.getLogger("vllm.dspark_dynamic")

# batch_depth "auto": methods whose target forward runs on Model Runner V2 with uniform-only FULL
# decode graphs (the fork's DeepSeek-V4 attention builders are UNIFORM_BATCH): a mixed-depth
# batch would fall back to eager there, so one depth per step ("max": no request verifies fewer
# drafts than its phase asks for).  Elsewhere (Model Runner V1, eager, varlen graphs with vLLM
# 0.33 adaptive verification) mixed batches cost nothing extra: "per_request".
_UNIFORM_BATCH_METHODS = ("dspark",)


def raw_options(additional_config: Any) -> Any | None:
    """The user's dspark_dynamic dict, or None when the plugin is not configured."""
    if isinstance(additional_config, dict):
        return additional_config.get(CONFIG_KEY)
    return None


def tokenizer_getter(model_config: Any):
    def get() -> Any:
        if model_config is None or getattr(model_config, "skip_tokenizer_init", False):
            return None
        from vllm.tokenizers import cached_tokenizer_from_config

        return cached_tokenizer_from_config(model_config)

    return get


def resolve_options(
    raw: Any, num_speculative_tokens: int | None, reasoning_parser: str | None, model_config: Any
) -> tuple[DynamicDepthOptions, ResolvedMarkers]:
    options = parse_options(raw, num_speculative_tokens)
    markers = resolve_markers(options, reasoning_parser, tokenizer_getter(model_config))
    options = replace(
        options,
        reasoning_start_ids=markers.start_ids,
        reasoning_end_ids=markers.end_ids,
        think_start_token=None,
        think_end_token=None,
    )
    return options, markers


def reasoning_parser_of(vllm_config: Any) -> str | None:
    for section in ("reasoning_config", "structured_outputs_config"):
        name = getattr(getattr(vllm_config, section, None), "reasoning_parser", None)
        if name:
            return name
    return None


def resolve_batch_depth(options: DynamicDepthOptions, vllm_config: Any) -> BatchDepth:
    if options.batch_depth != "auto":
        return BatchDepth(options.batch_depth)
    spec = getattr(vllm_config, "speculative_config", None)
    if getattr(spec, "enable_adaptive_verification", False):
        return BatchDepth.PER_REQUEST  # vLLM then captures varlen decode graphs: any mix replays
    method = getattr(spec, "method", None)
    compilation = getattr(vllm_config, "compilation_config", None)
    mode = getattr(compilation, "cudagraph_mode", None)
    eager = getattr(getattr(vllm_config, "model_config", None), "enforce_eager", False)
    has_full = bool(mode is not None and hasattr(mode, "has_full_cudagraphs") and mode.has_full_cudagraphs())
    if method in _UNIFORM_BATCH_METHODS and has_full and not eager:
        return BatchDepth.MAX
    return BatchDepth.PER_REQUEST
