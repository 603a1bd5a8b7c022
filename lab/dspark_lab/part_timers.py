"""Wall-clock timers around the parts of a vLLM engine step (in-process engine core, Model Runner V1).

``install()`` wraps each part's method, around the plugin's patches (so a patch counts in the
part it wraps; the patched ones are also timed under the patches: ``hooks`` is the difference),
and returns the dict every call adds its seconds to; the caller clears it before a
step and reads it after.  Parts nest: ``engine core`` holds ``core step`` and ``post step``;
``core step`` holds ``schedule``, ``executor execute`` (then ``worker execute``, ``execute
model``, which holds ``prepare inputs`` and ``model forward``), ``executor sample`` (then
``sample tokens``, and the drafter) and ``update from output``; what ``engine.step()`` spends
outside ``engine core`` (output processing, stat loggers) is its time less ``engine core``.
Used by ``scripts/profile_depth0.py --timers`` and by the wall-clock pool (``DSPARK_PART_TIMERS``).
"""

from __future__ import annotations

import functools
import importlib
import time

# label -> (module, class, method)
PARTS = {
    "engine core": ("vllm.v1.engine.core_client", "InprocClient", "get_output"),
    "core step": ("vllm.v1.engine.core", "EngineCore", "step"),
    "schedule": ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    "executor execute": ("vllm.v1.executor.uniproc_executor", "UniProcExecutor", "execute_model"),
    "worker execute": ("vllm.v1.worker.gpu_worker", "Worker", "execute_model"),
    "prepare inputs": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_prepare_inputs"),
    "model forward": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward"),
    "execute model": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    "executor sample": ("vllm.v1.executor.uniproc_executor", "UniProcExecutor", "sample_tokens"),
    "sample tokens": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    "drafter": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"),
    "update from output": ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    "update after schedule": ("vllm.v1.core.sched.scheduler", "Scheduler", "_update_after_schedule"),
    "post step": ("vllm.v1.engine.core", "EngineCore", "post_step"),
    "process outputs": ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs"),
    "stat loggers": ("vllm.v1.metrics.loggers", "StatLoggerManager", "record"),
}

# the parts the plugin patches (each also timed under its patch, see ``install``)
PATCHED = ("schedule", "update after schedule", "prepare inputs", "execute model", "sample tokens", "update from output")


def _resolve(module: str, cls_name: str, method: str) -> tuple[type, object] | None:
    try:
        cls = getattr(importlib.import_module(module), cls_name)
        return cls, getattr(cls, method)
    except (ImportError, AttributeError):
        return None


def missing() -> list[str]:
    """The parts the installed vLLM lacks (their timers are left out)."""
    return [name for name, where in PARTS.items() if _resolve(*where) is None]


def _wrap(parts: dict[str, tuple[str, str, str]], totals: dict[str, float]) -> None:
    for name, (module, cls_name, method) in parts.items():
        found = _resolve(module, cls_name, method)
        if found is None:
            continue
        cls, original = found

        def timed(*args, _original=original, _name=name, **kwargs):
            t = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                totals[_name] = totals.get(_name, 0.0) + time.perf_counter() - t

        setattr(cls, method, functools.wraps(original)(timed))


def install() -> dict[str, float]:
    """Wrap every part found (a part this vLLM lacks is left out); returns the totals dict.

    Call it before vLLM loads its general plugins and builds the engine (the engine binds
    ``EngineCore.step``): the ``PATCHED`` parts are timed under the plugin's patches first
    (``"<part> (vLLM)"``), then vLLM's plugins are loaded, then every part is timed around
    them; a part less its ``(vLLM)`` timing is the plugin's hooks on it (``hooks``)."""
    from vllm.plugins import load_general_plugins

    totals: dict[str, float] = {}
    _wrap({f"{name} (vLLM)": PARTS[name] for name in PATCHED}, totals)
    load_general_plugins()
    _wrap(PARTS, totals)
    return totals


def hook_times(totals: dict[str, float]) -> dict[str, float]:
    """Seconds each patched part's hooks took in ``totals`` (the part less its vLLM part), for
    the patched parts that ran."""
    return {name: totals.get(name, 0.0) - totals[f"{name} (vLLM)"] for name in PATCHED if f"{name} (vLLM)" in totals}


def hooks(totals: dict[str, float]) -> float:
    """Seconds the plugin's hooks took in ``totals``, all patched parts together."""
    return sum(hook_times(totals).values())
