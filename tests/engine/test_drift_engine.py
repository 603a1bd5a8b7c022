"""An abrupt drift with an overconfident drafter, in a real engine.

The drafter is right on every reasoning transition of the first half of the script and wrong on
every one of the second, and its confidence is the same either way; the answer is seed-like
(~95 % right).  Only each request's own record can tell the halves apart.  Costs are the seed
box's, given (``learn_cost`` off) for a DSpark-like drafter (no per-position drafting cost): the
adaptive policy's modelled tok/s over its own request-steps must reach 95 % of a per-step oracle
that knows each step's acceptance probability (2 drafts where they are all accepted, none where
none is)."""

import json

import pytest

from dspark_lab.simulate import CostModel
from dspark_lab import tiny_models
from dspark_lab.testbed import TESTBED_SCRIPT, prompt_ids

SCRIPT = TESTBED_SCRIPT
COST = CostModel(t0_ms=75.0, draft_ms=3.0, verify_ms=37.75)
REQUESTS = 4


@pytest.fixture(scope="module")
def drift(engine, tmp_path_factory):
    trace = tmp_path_factory.mktemp("drift-trace") / "trace.jsonl"
    spec = {
        "model": str(tiny_models.build_target(SCRIPT)),
        "speculative_config": {"method": "draft_model", "model": str(tiny_models.build_drift_draft(SCRIPT)),
                               "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {
            "policy": "adaptive", "trace_path": str(trace),
            "adaptive": {"learn_cost": False, "verify_cost_ratio": COST.verify_ms / COST.t0_ms,
                         "draft_cost_ratio": COST.draft_ms / COST.t0_ms, "draft_token_cost_ratio": 0.0}}},
        "batches": [[{"prompt_ids": prompt_ids(SCRIPT, thinking=True), "max_tokens": 300}]] * REQUESTS,
    }
    report = engine("drift_overconfident", spec)
    report["trace"] = [json.loads(line) for line in trace.read_text().splitlines()]
    return report


def oracle_tok_per_s() -> float:
    """The per-step oracle on the same script and drafter: 2 drafts where the drafter's rate is
    1 (the first half of reasoning) or ~0.95 (the answer), none where it is 0."""
    expected = SCRIPT.expected_output(thinking=True)
    table = tiny_models.drift_draft_transitions(SCRIPT, 0.949, 4)
    second_half = set(SCRIPT.reasoning_transitions()[len(SCRIPT.reasoning_transitions()) // 2:])
    tokens = ms = 0.0
    t = 0  # the last committed token is expected[t]; the prefill produced expected[0]
    while t < len(expected) - 1:
        k = 0 if expected[t] in second_half else 2
        run = 0
        while run < k and t + run + 1 < len(expected) and table.get(expected[t + run]) == expected[t + run + 1]:
            run += 1
        tokens += run + 1
        ms += COST.step_ms(k)
        t += run + 1
    return 1000.0 * tokens / ms


def test_outputs_are_the_script(drift):
    expected = SCRIPT.expected_output(thinking=True)
    assert all(batch["outputs"] == [expected] for batch in drift["batches"])


def test_adaptive_follows_an_abrupt_drift_of_an_overconfident_drafter(drift):
    rows = [r for r in drift["trace"] if "phase" in r]
    tokens = sum(r["tokens"] for r in rows)
    ms = sum(COST.step_ms(r["k"]) for r in rows)
    ours = 1000.0 * tokens / ms
    oracle = oracle_tok_per_s()
    print(f"drift, overconfident drafter: adaptive {ours:.2f} modelled tok/s, per-step oracle {oracle:.2f} "
          f"({ours / oracle:.3f})")
    assert ours >= 0.95 * oracle
    # both halves were verified at their right depths: 2 drafts in the first, none in the second
    reasoning = drift["batches"][-1]["phases"]["reasoning"]["depth_counts"]
    assert int(reasoning.get("2", 0)) > 20 * REQUESTS and int(reasoning.get("0", 0)) > 60 * REQUESTS
