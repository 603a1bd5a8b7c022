"""A depth policy per request inside a real vLLM engine (CPU, tiny models): every policy in one
engine, alone and sharing steps, exact and counted as vLLM counts; each request follows its own
depths, and a request at depth 0 alone in the engine makes the drafter draft nothing; the phase
policy with the live estimate estimates its own requests."""

import json

import pytest

from dspark_lab.scenarios import SCRIPT, THINKING_PROMPT

MAX_TOKENS = 260
POLICIES = {  # label -> the request's extra arguments
    "fixed 0": {"dspark_dynamic_depth": 0},
    "fixed 1": {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 1},
    "fixed 2": {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 2},
    "phase 1/2": {"dspark_dynamic_policy": "phase", "dspark_dynamic_reasoning_depth": 1,
                  "dspark_dynamic_answer_depth": 2},
    "adaptive": {"dspark_dynamic_policy": "adaptive"},
}
ALONE = list(POLICIES)  # batch i: policy i alone (concurrency 1)
MIXED = len(ALONE)  # the last batch: every policy at once, at most 4 running (concurrency 4)
EXPECTED = SCRIPT.expected_output(thinking=True)[:MAX_TOKENS]


def request(label):
    return {"prompt_ids": THINKING_PROMPT, "max_tokens": MAX_TOKENS, "extra_args": POLICIES[label]}


def spec(target, phase_draft, trace, batch_depth):
    return {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": phase_draft, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"policy": "adaptive", "batch_depth": batch_depth,
                                                 "trace_path": str(trace)}},
        "engine": {"max_num_seqs": 4},
        "batches": [[request(label)] for label in ALONE] + [[request(label) for label in POLICIES]],
    }


def run(engine, name, target, phase_draft, tmp_path_factory, batch_depth):
    trace = tmp_path_factory.mktemp(name) / "trace.jsonl"
    report = engine(name, spec(target, phase_draft, trace, batch_depth))
    report["trace"] = [json.loads(line) for line in trace.read_text().splitlines()]
    return report


@pytest.fixture(scope="module")
def per_request(engine, target, phase_draft, tmp_path_factory):
    return run(engine, "request_policy", target, phase_draft, tmp_path_factory, "per_request")


@pytest.fixture(scope="module")
def uniform_max(engine, target, phase_draft, tmp_path_factory):
    return run(engine, "request_policy_max", target, phase_draft, tmp_path_factory, "max")


def steps_of(trace):
    """The trace cut into engine steps: (request-step rows, each with its request's policy; step row)."""
    steps, rows, policy = [], [], {}
    for row in trace:
        if "step_s" in row:
            steps.append((rows, row))
            rows = []
        elif "phase" not in row:  # a request that chose its own policy
            policy[row["req"]] = row["policy"]
        else:
            rows.append({**row, "policy": policy.get(row["req"])})
    return steps


@pytest.mark.parametrize("fixture", ["per_request", "uniform_max"])
def test_every_policy_is_exact_and_counted_as_vllm_counts(fixture, request):
    report = request.getfixturevalue(fixture)
    for batch in report["batches"]:
        assert batch["outputs"] == [EXPECTED] * len(batch["outputs"])  # plain decoding's output
    last = report["batches"][-1]
    phases, vllm = last["phases"], last["vllm"]
    assert sum(p["verified"] for p in phases.values()) == vllm["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in phases.values()) == vllm["vllm:spec_decode_num_accepted_tokens"]
    assert sum(p["steps"] for p in phases.values()) == vllm["vllm:spec_decode_num_drafts"]
    policies = last["policies"]
    assert set(policies) == set(POLICIES)
    for key in ("steps", "verified", "accepted", "tokens", "zero_depth_steps"):
        for phase, totals in phases.items():
            assert sum(p[phase][key] for p in policies.values()) == totals[key]
    assert policies["fixed 2"]["answer"]["verified"] > 0
    if fixture == "per_request":  # under max a shared step lifts it (the last test)
        assert policies["fixed 0"]["reasoning"]["verified"] == policies["fixed 0"]["answer"]["verified"] == 0


def test_each_request_follows_its_own_depths(per_request):
    rows = [row for rows, _step in steps_of(per_request["trace"]) for row in rows]
    assert {row.get("policy") for row in rows} == set(POLICIES)
    by = {label: [r for r in rows if r.get("policy") == label] for label in POLICIES}
    assert {r["k"] for r in by["fixed 0"]} == {0}
    for label, depth in (("fixed 1", 1), ("fixed 2", 2)):
        ks = [r["k"] for r in by[label]]
        assert max(ks) == depth and ks.count(depth) >= 0.9 * len(ks)  # fewer only where vLLM cut drafts
    phase = by["phase 1/2"]
    assert {r["k"] for r in phase if r["phase"] == "reasoning"} <= {0, 1}
    assert max(r["k"] for r in phase if r["phase"] == "answer") == 2


def test_a_request_at_depth_0_alone_makes_the_drafter_draft_nothing(per_request):
    steps = steps_of(per_request["trace"])
    alone = [step for rows, step in steps
             if step["reqs"] == 1 and {r.get("policy") for r in rows} == {"fixed 0"} and step["decode_only"]]
    assert len(alone) > 50
    assert {step["draft_depth"] for step in alone} == {0}


def test_under_batch_depth_max_a_shared_step_verifies_the_deepest_request_depth(uniform_max, per_request):
    mixed = []
    for rows, _step in steps_of(uniform_max["trace"]):
        labels = {r.get("policy") for r in rows}
        if {"fixed 0", "fixed 2"} <= labels:
            mixed.append({r.get("policy"): r["k"] for r in rows})
    assert len(mixed) > 20
    lifted = sum(1 for step in mixed if step["fixed 0"] == 2)
    assert lifted >= 0.9 * len(mixed)  # the depth-0 request verified the step's one depth, 2
    # while sharing steps per request, the depth-0 request never verified a draft
    per = [r for rows, _s in steps_of(per_request["trace"]) for r in rows if r.get("policy") == "fixed 0"]
    assert {r["k"] for r in per} == {0}


@pytest.fixture(scope="module")
def phase_estimated(engine, target, phase_draft, tmp_path_factory):
    """The phase policy with ``live_estimate``: fixed 0 and fixed 2 alone, then both beside two
    of the server's own requests."""
    s = spec(target, phase_draft, tmp_path_factory.mktemp("phase_estimated") / "trace.jsonl", "per_request")
    s["additional_config"]["dspark_dynamic"].update(policy="phase", live_estimate=True)
    own = {"prompt_ids": THINKING_PROMPT, "max_tokens": MAX_TOKENS}
    s["batches"] = [[request("fixed 0")], [request("fixed 2")], [request("fixed 0"), request("fixed 2"), own, own]]
    return engine("request_policy_phase_estimated", s)


def test_the_phase_policy_with_the_live_estimate_is_exact_and_estimates_its_own_requests(phase_estimated):
    batches = phase_estimated["batches"]
    for batch in batches:
        assert batch["outputs"] == [EXPECTED] * len(batch["outputs"])
    assert batches[0]["estimate"] is None and batches[1]["estimate"] is None  # no request of its own yet
    estimate = batches[-1]["estimate"]
    assert set(estimate["all"]) == {"plain", "fixed"} and all(v > 0.0 for v in estimate["all"].values())
    last = batches[-1]
    assert sum(p["verified"] for p in last["phases"].values()) == last["vllm"]["vllm:spec_decode_num_draft_tokens"]
