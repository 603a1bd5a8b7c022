"""``method: "dspark_dynamic"`` and early validation, at the EngineArgs -> SpeculativeConfig boundary.

Runs in the process that parses arguments (``vllm serve``'s API server, or ``LLM(...)``), before
any engine process starts:
- the DSpark form ``{"method": "dspark_dynamic", "num_speculative_tokens": N, <options>}`` becomes
  ``{"method": "<base_method, default dspark>", "num_speculative_tokens": N}`` for vLLM and
  ``additional_config["dspark_dynamic"] = {<options>}`` for the controller, so vLLM's pydantic
  schema, method auto-detection and ``use_dspark()`` checks only ever see a method they know;
- the options are validated and their think markers resolved, so a bad config fails here with
  one clear message; the resolved form is written back into ``additional_config``;
- the scheduler patches are forced in (a vLLM without the patch points fails loudly here, and
  only when the feature is requested).
"""

from __future__ import annotations

import functools
from typing import Any

from dspark_dynamic.adapter.build import resolve_options
from dspark_dynamic.adapter.metrics import metrics_dir
from dspark_dynamic.core.options import ALIAS_METHOD, CONFIG_KEY, DynamicDepthConfigError, split_alias
from dspark_dynamic.adapter.patching import Patch, Where

MODULE = "vllm.engine.arg_utils"
# Speculative methods whose target runs on Model Runner V2 with FULL decode CUDA graphs.
MODEL_RUNNER_V2_METHODS = ("dspark",)


def rewrite_alias(engine_args: Any) -> None:
    """Apply the method alias to an EngineArgs in place (no-op unless it is used)."""
    spec = engine_args.speculative_config
    uses_alias = isinstance(spec, dict) and spec.get("method") == ALIAS_METHOD
    if getattr(engine_args, "spec_method", None) == ALIAS_METHOD:  # vLLM >= 0.32: --spec-method
        engine_args.spec_method = "dspark"
        uses_alias = True
        spec = spec or {}
    if not uses_alias:
        return
    vllm_part, ours = split_alias({k.replace("-", "_"): v for k, v in (spec or {}).items()})
    if "method" not in (spec or {}):
        vllm_part.pop("method")
    additional = engine_args.additional_config
    if additional is None:
        additional = {}
    if not isinstance(additional, dict):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: invalid option 'additional_config'={additional!r}; allowed: a dict"
        )
    existing = additional.get(CONFIG_KEY) or {}
    if not isinstance(existing, dict):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: invalid option {CONFIG_KEY!r}={existing!r}; allowed: a dict of options"
        )
    clash = sorted(k for k in ours if k in existing and existing[k] != ours[k])
    if clash:
        raise DynamicDepthConfigError(
            f"dspark_dynamic: option {clash[0]!r} is set both in --speculative-config "
            f"({ours[clash[0]]!r}) and in --additional-config ({existing[clash[0]]!r}); set it once"
        )
    engine_args.speculative_config = vllm_part or None
    engine_args.additional_config = {**additional, CONFIG_KEY: {**existing, **ours}}


def validate(engine_args: Any, speculative_config: Any, target_model_config: Any) -> None:
    additional = engine_args.additional_config
    if not isinstance(additional, dict) or CONFIG_KEY not in additional:
        return
    from dspark_dynamic.adapter.patches import cudagraph, scheduler

    needed = list(scheduler.PATCHES)
    if getattr(speculative_config, "method", None) in MODEL_RUNNER_V2_METHODS:
        needed += cudagraph.PATCHES  # its verify lengths need their own CUDA graphs
    for patch in needed:  # fail here, loudly, if this vLLM lacks a patch point
        patch.apply(strict=True)
    options, _ = resolve_options(  # the builder's validating half: bad input fails here
        additional[CONFIG_KEY],
        speculative_config,
        getattr(engine_args, "reasoning_parser", None) or None,
        target_model_config,
        getattr(engine_args, "reasoning_parser_plugin", None) or None,
    )
    engine_args.additional_config = {**additional, CONFIG_KEY: options.to_dict()}
    metrics_dir()  # a private snapshot directory, inherited by the engine processes started next


def _create_speculative_config(original):
    @functools.wraps(original)
    def create_speculative_config(self, target_model_config: Any, *args: Any, **kwargs: Any):
        rewrite_alias(self)
        speculative_config = original(self, target_model_config, *args, **kwargs)
        validate(self, speculative_config, target_model_config)
        return speculative_config

    return create_speculative_config


PATCHES = (
    Patch(
        "engine-args-speculative-config",
        MODULE,
        "EngineArgs.create_speculative_config",
        _create_speculative_config,
        params=("target_model_config",),
        why="method alias dspark_dynamic -> dspark; validate options before the engine starts",
        process="argument parsing (API server / LLM)",
        where=Where("engine/arg_utils.py:1669 (called :2024)", "engine/arg_utils.py:2060 (called :2594)",
                    "engine/arg_utils.py:2100 (called :2635)", v034="engine/arg_utils.py:2133 (called :2669)"),
        removable_when="vLLM accepts per-phase depth options in SpeculativeConfig",
    ),
)
