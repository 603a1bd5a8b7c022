"""Real vLLM engines kept alive side by side, each in its own process, driven one request at a time.

Wall-clock comparisons on a shared 2-core machine are only stable when every setting runs under
the same conditions: all engines stay alive together, rounds are interleaved, and each claim is
a median of paired per-round ratios (``dspark_lab.paired``).  An ``EnginePool`` starts
one process per setting (a fresh vLLM engine, in-process engine core) and sends it requests over
a pipe; only the engine asked works at any time, the others wait idle.

Requests run through the engine's step API, one at a time (one user, as on the seed box) or
several at once in a closed loop with staggered starts (``run(..., concurrency=N)``), all with
one prompt, or each slot of the loop with its own queue of prompts (``run(..., slots=...)``:
long-context benchmarks keep a short and a long request in flight together).  For every
engine step the worker records its wall time and the tokens it produced, and attributes the step
to the phase each request was in when the step was scheduled (the step that produces
``</think>`` is reasoning time; a step shared by several requests is shared equally); tokens
split at the marker, so per-phase token counts are exact.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dspark_lab.engine_run import confidence_reports, engine_env, spec_counters


@dataclass
class RequestTiming:
    """One request's measured run: tokens and busy seconds per phase, and its output."""

    tokens: dict[str, int] = field(default_factory=lambda: {"reasoning": 0, "answer": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"reasoning": 0.0, "answer": 0.0})
    output: list[int] = field(default_factory=list)  # the last request's output
    steps: int = 0
    outputs: list[list[int]] = field(default_factory=list)  # every request's output
    parts: dict[str, float] = field(default_factory=dict)  # seconds per part of a step (``DSPARK_PART_TIMERS``)
    origins: list[list[int]] = field(default_factory=list)  # per output: [slot, place in its queue] (``slots``)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


def _worker(conn: Any, spec: dict[str, Any]) -> None:
    for key, value in engine_env().items():
        os.environ.setdefault(key, value)
    for key, value in spec.get("env", {}).items():  # this engine's own settings; None unsets
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        kwargs: dict[str, Any] = dict(
            model=spec["model"], dtype="bfloat16", max_model_len=512, enforce_eager=True,
            disable_log_stats=False, distributed_executor_backend="uni", seed=0,
        )
        for key in ("speculative_config", "additional_config"):
            if spec.get(key):
                kwargs[key] = spec[key]
        kwargs.update(spec.get("engine", {}))  # extra LLM kwargs, e.g. dtype float32, max_model_len
        if os.environ.get("DSPARK_PART_TIMERS"):  # time the parts of every step (lab/dspark_lab/part_timers.py)
            global _PART_SECONDS
            from dspark_lab.part_timers import install

            _PART_SECONDS = install()
        llm = LLM(**kwargs)
        engine = llm.llm_engine
        conn.send({"ready": True, "info": _engine_info(engine)})
    except BaseException as exc:  # report, do not hang the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    count = 0
    while True:
        cmd = conn.recv()
        if cmd.get("quit"):
            break
        if cmd.get("counters"):
            from dspark_dynamic.adapter.patches.scheduler import latest_controller

            hook = latest_controller()
            estimate = getattr(hook.controller.policy, "estimate", None) if hook else None
            conn.send({"vllm": spec_counters(llm), "phases": hook.controller.stats.snapshot() if hook else None,
                       "live_states": len(hook.controller.states) if hook else None,
                       "confidence": confidence_reports(hook), "estimate": estimate() if estimate else None,
                       "prefix_cache": _prefix_cache_counters(llm)})
            continue
        count = _run_closed_loop(engine, cmd, count, SamplingParams, TokensPrompt, conn)
    conn.close()


_PART_SECONDS: dict[str, float] | None = None  # this worker's part timers, when installed


def _engine_info(engine: Any) -> dict[str, Any]:
    """The settings the engine runs with, as vLLM resolved them (defaults included)."""
    config = getattr(engine, "vllm_config", None)
    cache, model = getattr(config, "cache_config", None), getattr(config, "model_config", None)
    scheduler = getattr(config, "scheduler_config", None)
    return {"prefix_caching": getattr(cache, "enable_prefix_caching", None),
            "max_model_len": getattr(model, "max_model_len", None),
            "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None)}


def _prefix_cache_counters(llm: Any) -> dict[str, float]:
    """vLLM's prefix-cache counters: prompt tokens looked up and found cached (cumulative)."""
    names = {"vllm:prefix_cache_queries": "queries", "vllm:prefix_cache_hits": "hits"}
    out = {v: 0.0 for v in names.values()}
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] = metric.value
    return out


def _run_closed_loop(engine: Any, cmd: dict[str, Any], count: int, sampling_params: Any, tokens_prompt: Any,
                     conn: Any) -> int:
    """Run ``cmd["requests"]`` requests with at most ``cmd["concurrency"]`` in flight and send one
    ``RequestTiming`` back; returns the updated request counter.

    The first ``concurrency`` requests start ``stagger`` engine steps apart (so a step mixes
    requests in different phases), and each finished request is replaced at once while any are
    left (a closed loop: a setting whose requests finish sooner is not held below ``concurrency``).
    Each step's wall time is shared equally among the requests in flight and attributed to the
    phase each was in when the step ran (the step that produces the end marker is reasoning
    time); tokens split at the marker, so per-phase token counts are exact.

    ``cmd["slots"]`` (a list of ``concurrency`` prompt queues) instead of one prompt: slot ``s``
    runs its queue in order, one request at a time, and a finished request is replaced by the
    next of its own slot's queue, so the slots' mix of prompts holds while any queue has more
    (``requests`` is then the queues' total); ``RequestTiming.origins`` says which slot and
    queue place each output came from.
    """
    end_id, start_phase = cmd["end_id"], cmd["start_phase"]
    queues: list[list[list[int]]] | None = cmd.get("slots")
    concurrency = len(queues) if queues is not None else max(1, int(cmd.get("concurrency", 1)))
    total = sum(len(q) for q in queues) if queues is not None else int(cmd.get("requests", 1))
    stagger = max(0, int(cmd.get("stagger", 0)))
    params = sampling_params(temperature=0.0, max_tokens=cmd["max_tokens"])
    prompt = tokens_prompt(prompt_token_ids=cmd["prompt_ids"]) if queues is None else None
    timing = RequestTiming()
    live: dict[str, list[Any]] = {}  # request id -> [phase, tokens seen, slot]
    outputs: dict[str, list[int]] = {}
    origins: dict[str, list[int]] = {}
    taken = [0] * concurrency  # requests each slot has started
    started = steps_since_start = 0

    def free_slot() -> int | None:
        """The slot the next request goes to (None: every queue that has more is busy)."""
        if queues is None:
            return 0
        busy = {state[2] for state in live.values()}
        return next((s for s, q in enumerate(queues) if s not in busy and taken[s] < len(q)), None)

    def start(slot: int) -> None:
        nonlocal count, started, steps_since_start
        count += 1
        started += 1
        steps_since_start = 0
        req_id = f"bench-{count}"
        ids = prompt if queues is None else tokens_prompt(prompt_token_ids=queues[slot][taken[slot]])
        engine.add_request(req_id, ids, params)
        live[req_id] = [start_phase, 0, slot]
        origins[req_id] = [slot, taken[slot]]
        taken[slot] += 1

    first = free_slot()
    if first is not None:
        start(first)
    parts = _PART_SECONDS
    while live:
        if parts is not None:
            parts.clear()
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        if parts is not None:
            parts["engine step"] = dt
            for name, seconds in parts.items():
                timing.parts[name] = timing.parts.get(name, 0.0) + seconds
        timing.steps += 1
        steps_since_start += 1
        share = dt / len(live)
        for req_id in live:
            timing.seconds[live[req_id][0]] += share
        for out in outs:
            state = live.get(out.request_id)
            if state is None:
                continue
            tokens = list(out.outputs[0].token_ids)
            new = tokens[state[1]:]
            state[1] = len(tokens)
            if state[0] == "reasoning" and end_id in new:  # tokens after </think> are the answer's
                cut = new.index(end_id) + 1
                timing.tokens["reasoning"] += cut
                timing.tokens["answer"] += len(new) - cut
                state[0] = "answer"
            else:
                timing.tokens[state[0]] += len(new)
            outputs[out.request_id] = tokens
            if out.finished:
                del live[out.request_id]
        while started < total and len(live) < concurrency:
            if started < concurrency and live and steps_since_start < stagger:
                break  # the first requests start ``stagger`` steps apart
            slot = free_slot()
            if slot is None:
                break
            start(slot)  # later ones replace a finished request at once
            if started <= concurrency and stagger:
                break
    timing.origins = [origins[r] for r in outputs]
    timing.outputs = list(outputs.values())
    timing.output = timing.outputs[-1] if timing.outputs else []
    conn.send({"timing": timing.__dict__})
    return count


# An engine's KV cache in a pool: the testbed's models need a few MB for 8 requests of 512 tokens,
# and a dozen engines with VLLM_CPU_KVCACHE_SPACE's whole GiB each fill the machine's memory (the
# page cache goes, and the engines' step times with it).  vLLM's CPU platform lets a set
# VLLM_CPU_KVCACHE_SPACE override kv_cache_memory_bytes, so it is unset for these engines.
SMALL_KV_CACHE = {"engine": {"kv_cache_memory_bytes": 256 << 20}, "env": {"VLLM_CPU_KVCACHE_SPACE": None}}

# On the 2-core CPU machines here the first engines a process starts run slower than the later
# ones, whatever they run: four identical plain engines measured 0.91, 0.95, 1.00 and 1.00 of the
# last one's tok/s, in start order (not the kernel's DAMON reclaim: the same with it off).  Two
# tiny engines started first and left idle take those places, and three identical engines
# started after them measured within 2 % of each other.
BALLAST = 2


class EnginePool:
    """``EnginePool({name: engine_spec})``; ``run(name, request)`` -> RequestTiming.

    ``ballast``: tiny idle engines started before the measured ones (see ``BALLAST``)."""

    def __init__(self, specs: dict[str, dict[str, Any]], start_timeout: float = 600.0, ballast: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self.conns: dict[str, Any] = {}
        self.procs: dict[str, Any] = {}
        self.info: dict[str, dict[str, Any]] = {}  # per engine: settings as vLLM resolved them
        if ballast:
            from dspark_lab.tiny_models import Script, build_target

            tiny = {"model": str(build_target(Script())), **SMALL_KV_CACHE}
            specs = {**{f"(ballast {i})": tiny for i in range(ballast)}, **specs}
        try:
            for name, spec in specs.items():  # one at a time: two cores, and start-up is CPU-bound
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child, spec), daemon=True)
                proc.start()
                if not parent.poll(start_timeout):
                    raise RuntimeError(f"engine {name!r} did not start within {start_timeout:.0f} s")
                reply = parent.recv()
                if "error" in reply:
                    raise RuntimeError(f"engine {name!r} failed to start: {reply['error']}")
                self.conns[name], self.procs[name] = parent, proc
                self.info[name] = reply.get("info", {})
        except BaseException:
            self.close()
            raise

    def run(self, name: str, prompt_ids: list[int] | None, max_tokens: int, end_id: int,
            start_phase: str = "reasoning", requests: int = 1, concurrency: int = 1,
            stagger: int = 0, slots: list[list[list[int]]] | None = None) -> RequestTiming:
        """``requests`` copies of one request, at most ``concurrency`` in flight, the first ones
        started ``stagger`` engine steps apart; or, with ``slots``, one queue of prompts per slot
        (``prompt_ids``, ``requests`` and ``concurrency`` then unused; see ``_run_closed_loop``)."""
        conn = self.conns[name]
        conn.send({"prompt_ids": prompt_ids, "max_tokens": max_tokens, "end_id": end_id,
                   "start_phase": start_phase, "requests": requests, "concurrency": concurrency,
                   "stagger": stagger, "slots": slots})
        return RequestTiming(**conn.recv()["timing"])

    def counters(self, name: str) -> dict[str, Any]:
        """vLLM's spec-decode counters and the controller's per-phase totals (cumulative)."""
        conn = self.conns[name]
        conn.send({"counters": True})
        return conn.recv()

    def close(self) -> None:
        for name, conn in self.conns.items():
            try:
                conn.send({"quit": True})
            except OSError:
                pass
        for proc in self.procs.values():
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        self.conns, self.procs = {}, {}

    def __enter__(self) -> "EnginePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
