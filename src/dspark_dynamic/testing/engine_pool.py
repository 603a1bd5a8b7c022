"""Real vLLM engines kept alive side by side, each in its own process, driven one request at a time.

Wall-clock comparisons on a shared 2-core machine are only stable when every setting runs under
the same conditions: all engines stay alive together, rounds are interleaved, and each claim is
a median of paired per-round ratios (``dspark_dynamic.core.paired``).  An ``EnginePool`` starts
one process per setting (a fresh vLLM engine, in-process engine core) and sends it requests over
a pipe; only the engine asked works at any time, the others wait idle.

Each request runs alone through the engine's step API (one user, as on the seed box).  For every
engine step the worker records its wall time and the tokens it produced, and attributes the step
to the phase the request was in when the step was scheduled (the step that produces ``</think>``
is reasoning time); tokens split at the marker, so per-phase token counts are exact.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dspark_dynamic.testing.engine_run import confidence_reports, engine_env, spec_counters


@dataclass
class RequestTiming:
    """One request's measured run: tokens and busy seconds per phase, and its output."""

    tokens: dict[str, int] = field(default_factory=lambda: {"reasoning": 0, "answer": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"reasoning": 0.0, "answer": 0.0})
    output: list[int] = field(default_factory=list)
    steps: int = 0

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


def _worker(conn: Any, spec: dict[str, Any]) -> None:
    for key, value in engine_env().items():
        os.environ.setdefault(key, value)
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
        llm = LLM(**kwargs)
        engine = llm.llm_engine
        conn.send({"ready": True})
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
            conn.send({"vllm": spec_counters(llm), "phases": hook.controller.stats.snapshot() if hook else None,
                       "live_states": len(hook.controller.states) if hook else None,
                       "confidence": confidence_reports(hook)})
            continue
        end_id = cmd["end_id"]
        phase = cmd["start_phase"]
        count += 1
        req_id = f"bench-{count}"
        engine.add_request(req_id, TokensPrompt(prompt_token_ids=cmd["prompt_ids"]),
                           SamplingParams(temperature=0.0, max_tokens=cmd["max_tokens"]))
        timing = RequestTiming()
        seen = 0
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            outs = engine.step()
            dt = time.perf_counter() - t
            timing.steps += 1
            tokens = next((list(o.outputs[0].token_ids) for o in outs if o.request_id == req_id), None)
            if tokens is None:
                timing.seconds[phase] += dt
                continue
            new = tokens[seen:]
            seen = len(tokens)
            timing.seconds[phase] += dt
            if phase == "reasoning" and end_id in new:  # tokens after </think> are the answer's
                cut = new.index(end_id) + 1
                timing.tokens["reasoning"] += cut
                timing.tokens["answer"] += len(new) - cut
                phase = "answer"
            else:
                timing.tokens[phase] += len(new)
            timing.output = tokens
        conn.send({"timing": timing.__dict__})
    conn.close()


class EnginePool:
    """``EnginePool({name: engine_spec})``; ``run(name, request)`` -> RequestTiming."""

    def __init__(self, specs: dict[str, dict[str, Any]], start_timeout: float = 600.0) -> None:
        ctx = mp.get_context("spawn")
        self.conns: dict[str, Any] = {}
        self.procs: dict[str, Any] = {}
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
        except BaseException:
            self.close()
            raise

    def run(self, name: str, prompt_ids: list[int], max_tokens: int, end_id: int,
            start_phase: str = "reasoning") -> RequestTiming:
        conn = self.conns[name]
        conn.send({"prompt_ids": prompt_ids, "max_tokens": max_tokens, "end_id": end_id,
                   "start_phase": start_phase})
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
