"""Run one real vLLM engine (in this process) on the tiny models and report as JSON.

    python -m dspark_lab.engine_run SPEC.json OUT.json

SPEC: {"model": path, "speculative_config": {...} | null, "additional_config": {...} | null,
       "batches": [[{"prompt_ids": [...], "max_tokens": N, ...sampling params, "extra_args": {...}}, ...], ...],
       "engine": {extra LLM kwargs}, "abort_storm": {...} (optional),
       "verifier": "reference" | "blind" (optional: patch vLLM's rejection sampler, tests only),
       "record_drafts": true (optional: every proposal, the idle-skip counters and the rejection
       sampler's steps by deepest draft, tests only),
       "faults": [null | {"at": point, "after": N}, ...] (optional, one per batch: fault
       injection, tests only; see dspark_lab.faults)}
Each batch is one ``LLM.generate`` call; vLLM's spec-decode counters and the controller's
per-phase totals are reported after every batch (cumulative), so callers can take differences.
Tests run it in a subprocess: every engine gets a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:num_preemptions",
)


def engine_env() -> dict[str, str]:
    """Environment for a CPU engine run: offline, small KV cache, engine core in-process."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def spec_counters(llm: Any) -> dict[str, Any]:
    out: dict[str, Any] = {name: 0 for name in SPEC_COUNTERS}
    out["vllm:spec_decode_num_accepted_tokens_per_pos"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[metric.name] = metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out[metric.name] = list(metric.values)
    return out


def live_estimate(hook: Any) -> dict[str, dict[str, float]] | None:
    """The controller's policy's live estimate, where it keeps one (``estimate()``)."""
    estimate = getattr(hook.controller.policy, "estimate", None) if hook else None
    return estimate() if estimate is not None else None


def run(spec: dict[str, Any]) -> dict[str, Any]:
    for key, value in engine_env().items():
        os.environ.setdefault(key, value)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.monotonic()
    kwargs: dict[str, Any] = dict(
        model=spec["model"],
        dtype="bfloat16",
        max_model_len=512,
        enforce_eager=True,
        disable_log_stats=False,
        distributed_executor_backend="uni",
        seed=0,
    )
    if spec.get("speculative_config"):
        kwargs["speculative_config"] = spec["speculative_config"]
    if spec.get("additional_config"):
        kwargs["additional_config"] = spec["additional_config"]
    kwargs.update(spec.get("engine", {}))
    if spec.get("verifier"):  # tests: a reference verifier instead of vLLM's (see reference_sampler)
        from dspark_lab import reference_sampler

        reference_sampler.install(spec["verifier"], int(spec.get("verifier_seed", 0)))
    faults = None
    if spec.get("faults"):  # tests: fault injection (see dspark_lab.faults)
        from dspark_lab import faults

        faults.install(spec["faults"])
    if spec.get("record_drafts"):  # tests: every proposal the drafter returns
        from dspark_lab import draft_recorder

        draft_recorder.install()
    llm = LLM(**kwargs)
    init_s = time.monotonic() - t0
    from dspark_dynamic.adapter.patches.scheduler import latest_controller
    from dspark_dynamic.core.options import MARKER_KEYS

    report: dict[str, Any] = {"init_s": init_s, "batches": []}
    if hook := latest_controller():
        report["scheduler_cls"] = hook.scheduler_cls
        report["markers"] = hook.markers_source
        report["marker_ids"] = {k: list(getattr(hook.options, k)) for k in MARKER_KEYS}
        report["default_phase"] = hook.options.default_phase
    for i, batch in enumerate(spec["batches"]):
        if faults is not None:
            faults.arm(llm, spec["faults"][i])
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in batch]
        params = [
            SamplingParams(temperature=r.get("temperature", 0.0), max_tokens=r.get("max_tokens", 256),
                           n=r.get("n", 1), seed=r.get("seed"), stop=r.get("stop"),
                           stop_token_ids=r.get("stop_token_ids"), ignore_eos=r.get("ignore_eos", False),
                           logprobs=r.get("logprobs"), extra_args=r.get("extra_args"))
            for r in batch
        ]
        t = time.monotonic()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        hook = latest_controller()
        report["batches"].append(
            {
                "seconds": time.monotonic() - t,
                "outputs": [list(o.outputs[0].token_ids) for o in outputs],
                "all_outputs": [[list(c.token_ids) for c in o.outputs] for o in outputs],
                "logprobs": [sampled_logprobs(o.outputs[0]) for o in outputs],
                "vllm": spec_counters(llm),
                "phases": hook.controller.stats.snapshot() if hook else None,
                "policies": hook.controller.stats.policy_snapshot() if hook else None,
                "live_states": len(hook.controller.states) if hook else None,
                "confidence": confidence_reports(hook),
                "estimate": live_estimate(hook),
            }
        )
        if faults is not None:
            report["batches"][-1]["fail_open"] = faults.report(llm)
    if "abort_storm" in spec:
        report["abort_storm"] = abort_storm(llm, spec["abort_storm"])
    if spec.get("record_drafts"):
        report["drafts"] = draft_recorder.report()
    if hook := latest_controller():
        hook.controller.stats.close()
    return report


def sampled_logprobs(completion: Any) -> list[float] | None:
    """The logprob of each sampled token (None unless the request asked for logprobs)."""
    if completion.logprobs is None:
        return None
    return [float(step[token].logprob) for token, step in zip(completion.token_ids, completion.logprobs)]


def confidence_reports(hook: Any) -> dict[str, Any] | None:
    """Per phase: the draft-confidence calibration report (None without a gating policy)."""
    calibrators = getattr(hook.controller.policy, "calibrators", None) if hook else None
    if not calibrators:
        return None
    return {phase.label: {**cal.report.to_dict(), "auc": cal.report.auc(), "ece": cal.report.ece(),
                          "theta": list(cal.theta)} for phase, cal in calibrators.items()}


def abort_storm(llm: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Many short requests through the engine's step API, aborting some mid-flight.

    Between steps, every third step aborts a quarter of the live requests (as a client would).
    With ``in_flight``, every fourth step also aborts a quarter of the requests whose drafts are being
    verified *while that step runs*: they are finished in the engine core after the step was
    scheduled and before its output is processed (what a client disconnect does to a step on the
    worker); the front end is told right after the step.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.request import RequestStatus

    from dspark_dynamic.adapter.patches.scheduler import latest_controller

    engine = llm.llm_engine
    n = int(cfg.get("requests", 1000))
    prompt = TokensPrompt(prompt_token_ids=cfg["prompt_ids"])
    params = SamplingParams(temperature=0.0, max_tokens=int(cfg.get("max_tokens", 6)))
    ids = [f"storm-{i}" for i in range(n)]
    for rid in ids:
        engine.add_request(rid, prompt, params)
    hook = latest_controller()
    peak = 0
    finished = set()
    aborted: set[str] = set()
    in_flight: set[str] = set()  # engine-core (internal) request ids
    told: set[str] = set()
    steps = 0
    if cfg.get("in_flight"):
        scheduler = engine.engine_core.engine_core.scheduler
        update = scheduler.update_from_output

        def update_with_aborts(scheduler_output: Any, model_runner_output: Any, *a: Any, **k: Any) -> Any:
            if steps % 4 == 2:
                victims = sorted(scheduler_output.scheduled_spec_decode_tokens)[::4]
                scheduler.finish_requests(victims, RequestStatus.FINISHED_ABORTED)
                in_flight.update(victims)
            return update(scheduler_output, model_runner_output, *a, **k)

        scheduler.update_from_output = update_with_aborts
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished.add(out.request_id)
        steps += 1
        if in_flight - told:  # the front end hears of the engine core's aborts (internal ids)
            engine.abort_request(sorted(in_flight - told), internal=True)
            told |= in_flight
        peak = max(peak, len(hook.controller.states) if hook else 0)
        if steps % 3 == 1:  # abort every other request still in flight
            live = [rid for rid in ids if rid not in finished and rid not in aborted]
            batch = live[::2][: max(1, len(live) // 4)]
            engine.abort_request(batch)
            aborted.update(batch)
    return {
        "requests": n,
        "aborted": len(aborted),
        "aborted_in_flight": len(in_flight),
        "finished": len(finished),
        "steps": steps,
        "peak_states": peak,
        "live_states": len(hook.controller.states) if hook else None,
        "vllm": spec_counters(llm),
        "phases": hook.controller.stats.snapshot() if hook else None,
    }


def run_in_subprocess(spec: dict[str, Any], workdir: Path, timeout: float = 600) -> dict[str, Any]:
    """Run ``spec`` in a fresh Python process; returns the report (plus its log as "log")."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = workdir / "spec.json", workdir / "out.json", workdir / "engine.log"
    spec_path.write_text(json.dumps(spec))
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "dspark_lab.engine_run", str(spec_path), str(out_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **engine_env()},
            timeout=timeout,
        )
    log_text = log_path.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"engine run failed (rc={proc.returncode}); log tail:\n{log_text[-6000:]}")
    report = json.loads(out_path.read_text())
    report["log"] = log_text
    return report


def main(argv: list[str]) -> int:
    spec = json.loads(open(argv[1]).read())
    report = run(spec)
    with open(argv[2], "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
