"""The MoE testbed in a real engine: exact greedy output, drafting bounded by the plan, and the
side-by-side wall-clock harness (a one-round smoke form; speed itself is a benchmark's job)."""

import json

import pytest

from dspark_lab.testbed import TESTBED_SCRIPT, build_moe_target, build_testbed_draft, prompt_ids

EXPECTED = TESTBED_SCRIPT.expected_output(thinking=True)


@pytest.fixture(scope="module")
def testbed():
    return str(build_moe_target()), str(build_testbed_draft())


def controlled_run(engine, testbed, tmp_path_factory, name, **options):
    target, draft = testbed
    trace = tmp_path_factory.getbasetemp() / f"{name}.trace.jsonl"  # one per engine run (cached by name)
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": draft, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2,
                                                 "trace_path": str(trace), **options}},
        "batches": [[{"prompt_ids": prompt_ids(TESTBED_SCRIPT), "max_tokens": 300}]],
    }
    report = engine(name, spec)
    report["trace"] = [json.loads(line) for line in trace.read_text().splitlines()]
    return report


def draft_depths(report):
    return {r["draft_depth"] for r in report["trace"] if "step_s" in r and r["decode_only"]}


def test_testbed_output_is_the_script_and_counts_are_vllms(engine, testbed, tmp_path_factory):
    report = controlled_run(engine, testbed, tmp_path_factory, "testbed_phase")
    batch = report["batches"][0]
    assert batch["outputs"] == [EXPECTED]
    phases, v = batch["phases"], batch["vllm"]
    assert sum(p["verified"] for p in phases.values()) == v["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in phases.values()) == v["vllm:spec_decode_num_accepted_tokens"]
    # seed-like drafter: about 41 % of reasoning drafts and 87 % of answer drafts are right
    assert 0.3 < phases["reasoning"]["accepted"] / phases["reasoning"]["verified"] < 0.7
    assert phases["answer"]["accepted"] / phases["answer"]["verified"] > 0.75


def test_the_drafter_drafts_only_what_will_be_verified(engine, testbed, tmp_path_factory):
    bounded = controlled_run(engine, testbed, tmp_path_factory, "testbed_phase")
    unbounded = controlled_run(engine, testbed, tmp_path_factory, "testbed_unbounded", bound_drafts=False)
    assert draft_depths(bounded) == {1, 2}  # 1 while reasoning, 2 in the answer
    assert draft_depths(unbounded) == {2}  # without the bound: always num_speculative_tokens
    assert unbounded["batches"][0]["outputs"] == [EXPECTED]
    b, u = bounded["batches"][0]["phases"], unbounded["batches"][0]["phases"]
    assert b["reasoning"]["depth_counts"] == u["reasoning"]["depth_counts"]  # same verified depths


def test_wallclock_harness_smoke():
    from dspark_lab.wallclock import format_report, run_wallclock

    logged: list[str] = []
    # two epochs of one round each: fresh engines, the start order rotated (two settings: reversed) the second time
    result = run_wallclock(("fixed k=0", "phase 1/2"), rounds=2, requests=1, warmup=0, log=logged.append, epochs=2,
                           trace=True)
    starts = [line for line in logged if line.startswith("starting")]
    assert len(starts) == 2 and starts[0].endswith("fixed k=0, phase 1/2 ...") and starts[1].endswith(
        "phase 1/2, fixed k=0 ...")
    assert result.checks["outputs_identical_to_plain"]
    assert result.checks["phase 1/2: counts equal vLLM's"]
    ours, theirs = result.checks["phase 1/2: counts (steps, verified, accepted) ours / vLLM"]
    phases = result.checks["phase 1/2: phases"]
    assert ours == theirs and ours[0] == sum(p["steps"] for p in phases.values())
    # both epochs' requests are counted: the two engines' counts, added (a request's first token
    # comes from its prefill, not from a decode step)
    assert sum(p["tokens"] for p in phases.values()) == 2 * (len(EXPECTED) - 1)
    summary = result.summary()
    assert set(summary["tok_per_s"]) == {"fixed k=0", "phase 1/2"}
    assert len(result.rounds) == 2
    for name in ("fixed k=0", "phase 1/2"):
        for m in (r[name] for r in result.rounds):
            assert sum(m["tokens"].values()) == len(EXPECTED)
            assert m["tokens"]["reasoning"] == TESTBED_SCRIPT.reasoning_len + 1  # through </think>
    assert summary["tok_per_s"]["phase 1/2"]["reasoning"]["median"] > 0
    assert "phase 1/2" in result.traces
    assert "paired ratios" in format_report(result)
