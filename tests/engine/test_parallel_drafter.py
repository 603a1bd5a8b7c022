"""The parallel drafter (vLLM's ``dflash`` method, a hand-set tiny DFlash checkpoint) in a real CPU
engine: output is the script (lossless), and every draft is the designed table's, so vLLM's
counters equal what the tables predict; with the controller, reasoning drafts only what it
verifies (the DFlash block shrinks to one mask).  Step times are a benchmark's job
(``python -m dspark_lab.parallel_drafter --bench``)."""

import json
from pathlib import Path

import pytest

from dspark_lab.parallel_drafter import (
    DraftDesign,
    build_dflash_drafter,
    expected_counts,
    offline_report,
    speculative_config,
)
from dspark_lab.scenarios import ANSWER_PROMPT, SCRIPT, THINKING_PROMPT

DESIGN = DraftDesign()
FULL, ANSWER = SCRIPT.expected_output(thinking=True), SCRIPT.expected_output(thinking=False)
SLACK = 2  # tokens: the last step's accounting is vLLM's business


@pytest.fixture(scope="module")
def drafter() -> str:
    return str(build_dflash_drafter(SCRIPT, DESIGN))


def batch_counts(report, batch):
    now = report["batches"][batch]["vllm"]
    before = report["batches"][batch - 1]["vllm"] if batch else None

    def delta(key):
        return now[key] - (before[key] if before else 0)

    per_pos = now["vllm:spec_decode_num_accepted_tokens_per_pos"]
    if before:
        per_pos = [a - b for a, b in zip(per_pos, before["vllm:spec_decode_num_accepted_tokens_per_pos"])]
    return {"drafts": delta("vllm:spec_decode_num_drafts"), "draft_tokens": delta("vllm:spec_decode_num_draft_tokens"),
            "accepted": delta("vllm:spec_decode_num_accepted_tokens"), "per_pos": per_pos}


def close(got, want):
    assert abs(got["drafts"] - want["drafts"]) <= SLACK, (got, want)
    assert abs(got["draft_tokens"] - want["draft_tokens"]) <= SLACK, (got, want)
    assert abs(got["accepted"] - want["accepted"]) <= SLACK, (got, want)
    assert all(abs(g - w) <= SLACK for g, w in zip(got["per_pos"], want["per_pos"])), (got, want)


def test_offline_drafter_accuracy_and_confidence(drafter, target):
    report = offline_report(SCRIPT, Path(drafter), Path(target))
    first = {ph: report[f"pos1/{ph}"] for ph in ("reasoning", "answer", "all")}
    assert 0.45 < first["reasoning"]["accuracy"] < 0.6  # the phase draft's table (seed 27: 50.8 %)
    assert 0.85 < first["answer"]["accuracy"] < 0.95
    for pos in (1, 2):  # max prob separates right from wrong drafts, with overlap
        assert 0.78 < report[f"pos{pos}/all"]["auc_maxprob"] < 0.95
        assert report[f"pos{pos}/all"]["mean_maxp_right"] > report[f"pos{pos}/all"]["mean_maxp_wrong"]


def test_dflash_is_lossless_and_drafts_its_tables(engine, target, drafter):
    spec = {
        "model": target,
        "speculative_config": speculative_config(drafter, 2),
        "batches": [[{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}],
                    [{"prompt_ids": ANSWER_PROMPT, "max_tokens": 300}]],
    }
    report = engine("dflash_k2", spec)
    assert "method='dflash'" in report["log"]
    assert report["batches"][0]["outputs"] == [FULL]
    assert report["batches"][1]["outputs"] == [ANSWER]
    close(batch_counts(report, 0), expected_counts(SCRIPT, DESIGN, depth=2))
    close(batch_counts(report, 1), expected_counts(SCRIPT, DESIGN, depth=2, thinking=False))


def test_dflash_under_the_phase_controller(engine, target, drafter, tmp_path_factory):
    trace = tmp_path_factory.getbasetemp() / "dflash_phase.trace.jsonl"
    spec = {
        "model": target,
        "speculative_config": speculative_config(drafter, 2),
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2, "trace_path": str(trace)}},
        "batches": [[{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}]],
    }
    report = engine("dflash_phase", spec)
    batch = report["batches"][0]
    assert batch["outputs"] == [FULL]
    phases, v = batch["phases"], batch["vllm"]
    assert sum(p["verified"] for p in phases.values()) == v["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in phases.values()) == v["vllm:spec_decode_num_accepted_tokens"]
    want = expected_counts(SCRIPT, DESIGN, depth={"reasoning": 1, "answer": 2})["phases"]
    for phase in ("reasoning", "answer"):
        assert abs(phases[phase]["verified"] - want[phase]["verified"]) <= SLACK, (phases, want)
        assert abs(phases[phase]["accepted"] - want[phase]["accepted"]) <= SLACK, (phases, want)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    # the drafter drafts only what will be verified: one mask while reasoning, two in the answer
    assert {r["draft_depth"] for r in rows if "step_s" in r and r["decode_only"]} == {1, 2}


def context_spec(target, drafter, skip):
    """Reasoning at depth 0 (the drafter asked for nothing), the answer at depth 2."""
    return {
        "model": target,
        "speculative_config": speculative_config(drafter, 2),
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 0, "answer_depth": 2, "skip_idle_drafter": skip}},
        "record_drafts": True,
        "batches": [[{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}]],
    }


def written(contexts):
    """What a drafter's context writes leave: per slot, the position last written there (the
    states' sums: this drafter's context states are zero by design, so they agree trivially)."""
    last = {}
    for positions, slots, _sum in contexts:
        last.update(zip(slots, positions))
    return last


def test_an_idle_dflash_drafter_writes_its_context_without_its_forward(engine, target, drafter):
    """At depth 0 the drafter holds its context and writes it in batches before its next
    forward, leaving in its cache what vLLM's own path leaves (every slot's position), and runs
    no forward; it drafts the same when asked."""
    context_only = engine("dflash_context_only", context_spec(target, drafter, True))
    every_step = engine("dflash_every_step", context_spec(target, drafter, False))
    assert context_only["batches"][0]["outputs"] == every_step["batches"][0]["outputs"] == [FULL]
    assert "writes only its context on steps that draft nothing" in context_only["log"]
    assert "context written in batches before its next forward" in context_only["log"]
    # ... held at the runner, without vLLM's drafting inputs: the same slots and positions below
    assert "hold its context without vLLM's drafting inputs" in context_only["log"]
    assert "writes only its context" not in every_step["log"]
    on, off = context_only["drafts"], every_step["drafts"]
    # vLLM's path writes every step's context, reasoning's too; the idle steps' context here is
    # written in fewer, larger writes, to the same slots at the same positions
    assert len(off["dflash_contexts"]) > 100 and len(on["dflash_contexts"]) < len(off["dflash_contexts"]) // 2
    assert written(on["dflash_contexts"]) == written(off["dflash_contexts"])
    assert sum(len(p) for p, _s, _x in on["dflash_contexts"]) <= sum(len(p) for p, _s, _x in off["dflash_contexts"])
    assert on["proposals"] == off["proposals"] and len(on["proposals"]) > 15  # the answer drafts
    # vLLM's path runs one forward per step; here only the drafting steps run one
    idle_steps = len(off["dflash_contexts"]) - len(off["proposals"])
    assert off["dflash_forwards"] == len(off["dflash_contexts"]) and idle_steps > 80
    assert on["dflash_forwards"] == len(on["proposals"])
