"""Draft confidences in a real engine: captured where draft_model samples, carried with the draft
ids through the multiprocess executor, calibrated per phase, and gating each request's depth."""

import pytest

from dspark_lab import tiny_models
from dspark_lab.testbed import TESTBED_SCRIPT, build_testbed_draft, prompt_ids, drafter_confidence_auc

from conftest import counters_delta

PROMPT = prompt_ids(TESTBED_SCRIPT, thinking=True)
EXPECTED = TESTBED_SCRIPT.expected_output(thinking=True)
BATCHES = [[{"prompt_ids": PROMPT, "max_tokens": 300}]] * 3 + [[{"prompt_ids": PROMPT, "max_tokens": 300}] * 2]


@pytest.fixture(scope="module")
def gated(engine):
    target = str(tiny_models.build_target(TESTBED_SCRIPT))
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": str(build_testbed_draft()), "num_speculative_tokens": 2},
        # costs given; drafting priced at 0: every position is drafted and the gate alone decides
        "additional_config": {"dspark_dynamic": {"policy": "adaptive",
                                                 "adaptive": {"learn_cost": False, "draft_token_cost_ratio": 0.0}}},
        "engine": {"distributed_executor_backend": "mp"},
        "batches": BATCHES,
    }
    return engine("confidence_gated_mp", spec)


def test_outputs_equal_plain_decoding(gated):
    for batch in gated["batches"]:
        assert all(out == EXPECTED for out in batch["outputs"])


def test_per_phase_counts_equal_vllms(gated):
    for i, batch in enumerate(gated["batches"]):
        before = gated["batches"][i - 1]["phases"] if i else None
        ours = {k: sum(p[k] - (before[ph][k] if before else 0) for ph, p in batch["phases"].items())
                for k in ("steps", "verified", "accepted")}
        vllm = counters_delta(gated, i)
        assert (ours["steps"], ours["verified"], ours["accepted"]) == (
            vllm["drafts"], vllm["draft_tokens"], vllm["accepted_tokens"])


def test_confidences_arrive_and_separate_right_from_wrong_drafts(gated):
    report = gated["batches"][-1]["confidence"]
    reasoning, answer = report["reasoning"], report["answer"]
    assert reasoning["labels"] > 100 and answer["labels"] > 50  # through the mp executor's pickles
    # labels come only from verified drafts (the gate keeps the doubtful ones out), so the
    # measured AUC sits below the drafter's own (~0.85 over every reasoning transition)
    assert drafter_confidence_auc()["reasoning"] > 0.8
    assert reasoning["auc"] > 0.6
    assert reasoning["theta"][0] > 0.3  # a clear positive slope on the feature
    assert abs(reasoning["predicted"] - reasoning["observed"]) < 0.1 * reasoning["labels"]


def test_the_gate_moves_depths_off_the_phase_defaults(gated):
    reasoning = gated["batches"][-1]["phases"]["reasoning"]["depth_counts"]
    # the phase default is 1 for every step; the gate verifies doubtful reasoning drafts not at all
    assert int(reasoning.get("0", 0)) > 20 and int(reasoning.get("1", 0)) > 20
