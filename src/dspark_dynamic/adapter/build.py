"""The one way in: vLLM's config -> resolved options -> a ready depth controller (adapter room).

Data flows one way::

    additional_config["dspark_dynamic"] --parse_options--> options
        --resolve_markers (options, then the reasoning parser, then the tokenizer)--> markers
        (ids or id sequences; or the parser's own API)
        --> policy (phase | adaptive | a peer's rule; + the live estimate), batch depth, stats (+ trace file),
            the per-request policy reader --> DepthController

``resolve_options`` is the validating half: the argument-parsing process runs it (through the
config adapter) so bad input fails before any engine starts, and writes the resolved options
(explicit marker ids) back into ``additional_config``, so the engine core needs no tokenizer.
``build_controller`` runs it again in the engine core and assembles the controller; the
scheduler adapter holds no construction logic of its own.
"""

from __future__ import annotations

import importlib.util

import logging
import os
from dataclasses import dataclass, replace
from typing import IO, Any

from dspark_dynamic.adapter.markers import ResolvedMarkers, check_marker_ids, resolve_markers
from dspark_dynamic.adapter.patches.request_policy import request_policy_reader
from dspark_dynamic.core.controller import DepthController
from dspark_dynamic.core.options import (
    CONFIG_KEY,
    PARALLEL_DRAFTERS,
    PEER_POLICIES,
    SEQUENTIAL_DRAFT_TOKEN_COST,
    DynamicDepthConfigError,
    DynamicDepthOptions,
    parse_options,
)
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.policy import BatchDepth, DepthPolicy, PhasePolicy
from dspark_dynamic.core.request_policy import server_label
from dspark_dynamic.core.stats import PhaseStats

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


def worker_options(vllm_config: Any) -> DynamicDepthOptions | None:
    """The parsed options as a worker sees them (no markers resolved), or None when the plugin is
    not configured or its options are bad (reported where the controller is built)."""
    raw = raw_options(getattr(vllm_config, "additional_config", None))
    n = getattr(getattr(vllm_config, "speculative_config", None), "num_speculative_tokens", None)
    if raw is None or not n:
        return None
    try:
        return parse_options(raw, n)
    except DynamicDepthConfigError:
        return None


def tokenizer_getter(model_config: Any):
    def get() -> Any:
        if model_config is None or getattr(model_config, "skip_tokenizer_init", False):
            return None
        from vllm.tokenizers import cached_tokenizer_from_config

        return cached_tokenizer_from_config(model_config)

    return get


def check_trace_path(path: str | None) -> None:
    """A trace file must be creatable: its directory exists and is writable."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: invalid option 'trace_path'={path!r}; allowed: a file in an existing "
            f"directory ({directory!r} does not exist)"
        )
    if not os.access(directory, os.W_OK):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: invalid option 'trace_path'={path!r}; allowed: a file in a writable "
            f"directory ({directory!r} is not writable)"
        )


def resolve_options(
    raw: Any, speculative_config: Any, reasoning_parser: str | None, model_config: Any,
    reasoning_parser_plugin: str | None = None,
) -> tuple[DynamicDepthOptions, ResolvedMarkers]:
    """Validate the user's options against vLLM's config and resolve the think markers.

    Raises ``DynamicDepthConfigError`` (one message naming the key and what is allowed); marker
    ids outside the vocabulary (the tokenizer's, or the model's without a tokenizer) among them.
    """
    options = parse_options(raw, getattr(speculative_config, "num_speculative_tokens", None))
    if getattr(speculative_config, "enable_adaptive_verification", False) and options.policy == "adaptive":
        raise DynamicDepthConfigError(
            "dspark_dynamic: invalid option 'policy'='adaptive' together with vLLM's "
            "enable_adaptive_verification; allowed: policy 'phase' (it caps, per phase, the drafts "
            "adaptive verification may admit), or turn enable_adaptive_verification off"
        )
    check_trace_path(options.trace_path)
    if getattr(model_config, "skip_tokenizer_init", False):  # no tokenizer: the model's vocabulary bounds the ids
        get_size = getattr(model_config, "get_vocab_size", None)
        check_marker_ids(options, get_size() if get_size is not None else None, "the model's")
    markers = resolve_markers(options, reasoning_parser, tokenizer_getter(model_config), reasoning_parser_plugin)
    if markers.api is None:  # marker ids say it all: the engine core needs no tokenizer
        options = replace(
            options,
            reasoning_start_ids=markers.start_ids,
            reasoning_end_ids=markers.end_ids,
            reasoning_reset_ids=markers.reset_ids,
            default_phase=markers.default.label,
            think_start_token=None,
            think_end_token=None,
        )
    return options, markers


def build_policy(options: DynamicDepthOptions, drafter_catches_up: bool = False,
                 idle_drafter_runs: bool = False) -> DepthPolicy:
    """``drafter_catches_up``: the workers skip the idle drafter (``expects_drafter_catch_up``);
    ``idle_drafter_runs``: the drafter runs its forward even on steps that draft nothing (vLLM's
    own behaviour, and Model Runner V2's DSpark, which drafts its block every step).  With
    ``live_estimate`` a policy other than adaptive (which has its own) is wrapped in
    ``live.Estimated``, its step cost and acceptance priors from the ``adaptive`` knobs."""
    a = options.adaptive
    if options.policy == "adaptive":
        from dspark_dynamic.core.adaptive import AdaptivePolicy

        return AdaptivePolicy(
            options.num_speculative_tokens,
            {Phase.REASONING: options.reasoning_depth, Phase.ANSWER: options.answer_depth},
            min_depth=a.min_depth, verify_cost_ratio=a.verify_cost_ratio, draft_cost_ratio=a.draft_cost_ratio,
            draft_token_cost_ratio=a.draft_token_cost_ratio or 0.0, learn_cost=a.learn_cost,
            prior_weight=a.prior_weight, window=a.window, confidence=a.confidence,
            drafter_catches_up=drafter_catches_up, idle_drafter_runs=idle_drafter_runs,
            context_features=a.context_features,
        )
    policy: DepthPolicy
    if options.policy in PEER_POLICIES:
        from dspark_dynamic.core.peers import PEERS

        policy = PEERS[options.policy](options.num_speculative_tokens)
    else:
        policy = PhasePolicy(options.reasoning_depth, options.answer_depth)
    if not options.live_estimate:
        return policy
    from dspark_dynamic.core.live import Estimated

    return Estimated(
        policy, options.num_speculative_tokens, verify_cost_ratio=a.verify_cost_ratio,
        draft_cost_ratio=a.draft_cost_ratio, draft_token_cost_ratio=a.draft_token_cost_ratio or 0.0,
        learn_cost=a.learn_cost, prior_weight=a.prior_weight, window=a.window,
        drafter_catches_up=drafter_catches_up, idle_drafter_runs=idle_drafter_runs,
    )


@dataclass
class BuiltController:
    """What the engine core's scheduler carries: the controller and how it was configured."""

    options: DynamicDepthOptions
    markers: ResolvedMarkers
    batch_depth: BatchDepth
    controller: DepthController
    trace: IO[str] | None

    confidence: str = ""  # whether the policy gates on draft confidences, and why (not)

    def describe(self, method: str | None) -> str:
        o = self.options
        return (
            f"dspark_dynamic: depth controller on (method={method}, num_speculative_tokens="
            f"{o.num_speculative_tokens}, policy={o.policy}, reasoning_depth={o.reasoning_depth}, "
            f"answer_depth={o.answer_depth}, batch_depth={self.batch_depth.value}, "
            f"bound_drafts={o.bound_drafts}" + (", live_estimate=True" if o.live_estimate else "")
            + f"; markers: {self.markers.source}"
            + (f"; draft confidences: {self.confidence}" if self.confidence else "") + ")"
        )


# Drafters whose proposals carry no distribution, or sample outside the captured calls.
_NO_DISTRIBUTION = ("ngram", "ngram_gpu", "suffix", "custom_class")
_OWN_SAMPLER = ("gemma4", "step3p5_mtp")


def confidence_status(options: DynamicDepthOptions, vllm_config: Any) -> str:
    """Whether draft confidences will reach the policy, and if not, why (the start-up line)."""
    if not options.learns_depth:
        return ""
    if not options.reads_confidences:
        return "off (adaptive.confidence is false)" if options.policy == "adaptive" else ""
    spec = getattr(vllm_config, "speculative_config", None)
    method = getattr(spec, "method", None)
    if method in _NO_DISTRIBUTION:
        return f"none ({method} drafts carry no distribution); acceptance estimates only"
    if method in _OWN_SAMPLER or getattr(spec, "use_local_argmax_reduction", False):
        return f"none ({method} samples without logits the plugin can read); acceptance estimates only"
    if getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False):
        return ("none (async scheduling never hands draft ids to the scheduler; --no-async-scheduling "
                "lets them through); acceptance estimates only")
    if method != "dspark" and getattr(vllm_config, "use_v2_model_runner", False):
        return f"none (Model Runner V2 hands the plugin confidences of dspark drafts only, not {method}); acceptance estimates only"
    if method == "dspark":
        return ("on (dspark, Model Runner V2: the checkpoint's confidence head when its weights are there, "
                "else log-odds of the maximum draft probability, computed inside the captured draft step)")
    return f"on ({method}: log-odds of the maximum draft probability, captured where the drafter samples)"


def build_controller(vllm_config: Any) -> BuiltController | None:
    """The ready controller for ``vllm_config``, or None when dspark_dynamic is not configured."""
    raw = raw_options(getattr(vllm_config, "additional_config", None))
    if raw is None:
        return None
    plugin = getattr(getattr(vllm_config, "structured_outputs_config", None), "reasoning_parser_plugin", None)
    options, markers = resolve_options(
        raw, vllm_config.speculative_config, reasoning_parser_of(vllm_config), vllm_config.model_config,
        plugin or None,
    )
    options = resolve_draft_cost(options, getattr(vllm_config.speculative_config, "method", None))
    batch_depth = resolve_batch_depth(options, vllm_config)
    trace = open(options.trace_path, "a") if options.trace_path else None  # flushed when the engine idles
    catches_up = expects_drafter_catch_up(options, vllm_config)
    idle_runs = not (catches_up or expects_context_only(options, vllm_config))
    policy = build_policy(options, catches_up, idle_drafter_runs=idle_runs)
    stats = PhaseStats(trace, server_label(options.policy, options.reasoning_depth, options.answer_depth))
    controller = DepthController(markers.detector(), policy, batch_depth, stats, request_policy_reader(options))
    return BuiltController(options, markers, batch_depth, controller, trace, confidence_status(options, vllm_config))


def idle_drafter_skip_requested(options: DynamicDepthOptions) -> bool:
    """The options ask the workers to skip an idle drafter (it is asked for 0 drafts only when
    drafts are bound to the plans)."""
    return options.skip_idle_drafter and options.bound_drafts


def expects_drafter_catch_up(options: DynamicDepthOptions, vllm_config: Any) -> bool:
    """The workers skip the drafter on steps that draft nothing and catch its cache up on its
    next run (``adapter/patches/drafter_skip.py``).  A worker may still refuse (data parallel,
    M-RoPE: it says so at start-up); the cost model then merely fits a few steps less."""
    spec = getattr(vllm_config, "speculative_config", None)
    return bool(
        idle_drafter_skip_requested(options)
        and getattr(spec, "method", None) == "draft_model"
        and not getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False)
    )


def expects_context_only(options: DynamicDepthOptions, vllm_config: Any) -> bool:
    """A DFlash drafter on Model Runner V1 writes only its context on steps that draft nothing
    (``adapter/patches/dflash_context.py``), so drafting nothing saves its forward.  A worker
    may still refuse (data parallel: it says so at start-up); the cost model then prices a
    forward that runs anyway at about nothing."""
    spec = getattr(vllm_config, "speculative_config", None)
    return bool(
        idle_drafter_skip_requested(options)
        and getattr(spec, "method", None) == "dflash"
        and not getattr(vllm_config, "use_v2_model_runner", False)
        and _has_module("vllm.v1.spec_decode.dflash")  # vLLM 0.34 has no Model Runner V1
    )


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolve_draft_cost(options: DynamicDepthOptions, method: str | None) -> DynamicDepthOptions:
    """``adaptive.draft_token_cost_ratio`` unset: 0 for a parallel drafter (every position in one
    pass), ``SEQUENTIAL_DRAFT_TOKEN_COST`` for one that runs a forward per drafted position."""
    if options.adaptive.draft_token_cost_ratio is not None:
        return options
    ratio = 0.0 if method in PARALLEL_DRAFTERS else SEQUENTIAL_DRAFT_TOKEN_COST
    return replace(options, adaptive=replace(options.adaptive, draft_token_cost_ratio=ratio))


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
