"""Draft-confidence capture against the installed vLLM's own proposer code (CPU tensors)."""

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from dspark_dynamic.adapter.patches import confidence  # noqa: E402
from dspark_dynamic.adapter.patches.confidence import (  # noqa: E402
    ATTR,
    FIELD,
    Capture,
    confidence_wanted,
    log_max_prob,
    max_prob_log_odds,
)
from dspark_dynamic.core.confidence import feature_of_log_prob  # noqa: E402

VOCAB = 11


def test_feature_is_log_odds_of_the_max_probability_at_the_requests_temperature():
    logits = torch.tensor([[4.0, 1.0, 0.0], [0.0, 0.0, 0.0], [30.0, 0.0, 0.0]])
    probs = torch.softmax(logits, -1).max(-1).values
    expected = torch.log(probs / (1 - probs))
    got = max_prob_log_odds(logits)
    assert got[:2] == pytest.approx(expected[:2].tolist(), rel=1e-5)
    assert got[2] == pytest.approx(30.0 - math.log(2.0), abs=1e-3)  # no log(0) for a peaked row
    assert max_prob_log_odds(torch.tensor([[90.0, 0.0]]))[0] == 40.0  # clamped
    hot = max_prob_log_odds(logits, torch.tensor([2.0, 1.0, 0.0]))  # T=0: greedy, unscaled
    p0 = torch.softmax(logits[0] / 2.0, -1).max()
    assert hot[0] == pytest.approx(math.log(p0 / (1 - p0)), rel=1e-5)
    assert hot[2] == pytest.approx(got[2])
    # parallel drafting: K rows per request share the request's temperature
    rows = logits[:2].repeat_interleave(2, dim=0)
    par = max_prob_log_odds(rows, torch.tensor([2.0, 1.0]))
    assert par[0] == par[1] == pytest.approx(hot[0].item())


def test_capture_shapes_sequential_and_parallel_proposals():
    seq = Capture()
    seq.rows = [(torch.tensor([1.0, 2.0]), False), (torch.tensor([3.0, 4.0]), False)]  # scored rows
    seq.finish(torch.zeros(2, 2, dtype=torch.long))
    assert seq.last.tolist() == [[1.0, 3.0], [2.0, 4.0]] and seq.rows is None
    par = Capture()
    par.rows = [(torch.tensor([1.0, 2.0, 3.0, 4.0]), False)]  # request-major: K=2 rows per request
    par.finish(torch.zeros(2, 2, dtype=torch.long))
    assert par.last.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    odd = Capture()
    odd.rows = [(torch.tensor([1.0]), False)]
    odd.finish(torch.zeros(2, 2, dtype=torch.long))  # rows that do not match: dropped
    assert odd.last is None


def test_kept_logits_are_scored_once_at_finish_as_each_row_would_be():
    g = torch.Generator().manual_seed(3)
    first, second = torch.randn(3, VOCAB, generator=g), torch.randn(3, VOCAB, generator=g) * 4
    temperature = torch.tensor([0.0, 0.7, 2.0])
    for t in (None, temperature):
        seq = Capture()
        seq.temperature, seq.rows = t, []
        seq.keep(first)
        seq.record(second * 1.0)  # a mix: one kept, one scored at once
        seq.finish(torch.zeros(3, 2, dtype=torch.long))
        want = torch.stack([log_max_prob(first, t), log_max_prob(second, t)], dim=1)
        assert torch.allclose(seq.last, want, rtol=1e-5)
        kept = Capture()
        kept.temperature, kept.rows = t, []
        kept.keep(first)
        kept.keep(second)
        kept.finish(torch.zeros(3, 2, dtype=torch.long))
        assert torch.allclose(kept.last, want, rtol=1e-5)
        par = Capture()  # parallel drafting: one call, K=2 rows per request, request-major
        par.temperature, par.rows = t, []
        par.keep(torch.stack([first, second], dim=1).reshape(6, VOCAB))
        par.finish(torch.zeros(3, 2, dtype=torch.long))
        assert torch.allclose(par.last, want, rtol=1e-5)


def test_the_captured_score_gives_the_log_odds_feature():
    """The capture keeps log q* (two calls per proposal); the host turns it into the feature.  It
    is the exact log-odds to within float32's resolution of 1 - q* (0.01 at a feature of ~10, the
    last row), saturates beyond (about 16.6, not an infinity), and is monotone in q*."""
    g = torch.Generator().manual_seed(4)
    logits = torch.cat([torch.randn(4, VOCAB, generator=g) * 3, torch.tensor([[12.0] + [0.0] * (VOCAB - 1)])])
    temperature = torch.tensor([0.0, 0.5, 1.0, 3.0, 1.0])
    for x in (logits, logits.bfloat16()):
        for t in (None, temperature):
            got = [feature_of_log_prob(v) for v in log_max_prob(x, t).tolist()]
            exact = max_prob_log_odds(x, t).tolist()
            assert got[:4] == pytest.approx(exact[:4], rel=1e-4, abs=1e-4)
            assert got[4] == pytest.approx(exact[4], abs=0.02)
    peaked = [feature_of_log_prob(v) for v in log_max_prob(torch.tensor([[20.0, 0.0], [40.0, 0.0], [90.0, 0.0]])).tolist()]
    assert 15.0 < peaked[0] <= peaked[1] <= peaked[2] < 17.0
    assert [feature_of_log_prob(v) for v in (-1e-9, -0.5, -0.7, -3.0)] == sorted(
        [feature_of_log_prob(v) for v in (-1e-9, -0.5, -0.7, -3.0)], reverse=True)
    assert feature_of_log_prob(math.log(0.5)) == pytest.approx(0.0, abs=1e-12)


def test_the_runner_hands_over_features_with_the_draft_ids():
    """``take_draft_token_ids`` attaches one feature row per request it returns, once."""
    captured = Capture()
    captured.last = log_max_prob(torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [5.0, 1.0, 0.0]])).reshape(3, 1)
    drafter = SimpleNamespace(**{ATTR: captured})
    runner = SimpleNamespace(drafter=drafter)
    take = confidence._take_draft_token_ids(lambda self: SimpleNamespace(req_ids=["a", "b"]))
    out = take(runner)
    p = torch.softmax(torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), -1).max(-1).values
    assert getattr(out, FIELD) == [[pytest.approx(math.log(q / (1 - q)), rel=1e-5)] for q in p.tolist()]
    assert captured.last is None and not hasattr(take(runner), FIELD)


def config(policy="adaptive", confidence=True):
    opts = {"policy": policy, "adaptive": {"confidence": confidence}}
    return SimpleNamespace(additional_config={"dspark_dynamic": opts},
                           speculative_config=SimpleNamespace(num_speculative_tokens=2))


def test_capture_only_when_the_adaptive_policy_gates_on_confidences():
    assert confidence_wanted(config())
    assert not confidence_wanted(config(confidence=False))
    assert not confidence_wanted(config(policy="phase"))
    assert not confidence_wanted(SimpleNamespace(additional_config=None, speculative_config=None))


@pytest.fixture()
def proposer():
    """A bare SpecDecodeBaseProposer running vLLM's own sampling code with the patches applied."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    for patch in confidence.PATCHES:
        if patch.module == confidence.PROPOSER_MODULE:
            assert patch.apply(strict=True)
    head = torch.randn(VOCAB, 4, generator=torch.Generator().manual_seed(0))
    p = object.__new__(SpecDecodeBaseProposer)
    p.model = SimpleNamespace(compute_logits=lambda h: h @ head.T)
    p.use_local_argmax_reduction = False
    p.use_heterogeneous_vocab = False
    p._enable_probabilistic_draft_probs = False
    p.vllm_config = config()
    p.head = head
    confidence._attach(p)  # what the patched constructor does
    yield p
    for patch in confidence.PATCHES:
        if patch.module == confidence.PROPOSER_MODULE:
            patch.revert()


def test_greedy_drafts_unchanged_and_one_feature_per_draft(proposer):
    hidden = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    metadata = SimpleNamespace(all_greedy=True, temperature=None)
    capture = proposer.__dict__[ATTR]
    assert isinstance(capture, Capture)
    capture.rows = []
    ids_1 = proposer._sample_draft_tokens(hidden, metadata)[0]
    ids_2 = proposer._sample_draft_tokens(hidden * 0.5, metadata)[0]
    logits = hidden @ proposer.head.T
    assert ids_1.tolist() == logits.argmax(-1).tolist()  # vLLM's greedy drafts, unchanged
    capture.finish(torch.stack([ids_1, ids_2], dim=1))
    assert capture.last.shape == (3, 2)
    assert capture.last[:, 0].tolist() == pytest.approx(log_max_prob(logits).tolist(), rel=1e-5)


def test_sampled_drafts_scored_at_the_request_temperature_before_vllm_scales_them(proposer):
    proposer._enable_probabilistic_draft_probs = True
    proposer.use_fp64_gumbel = False
    hidden = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    logits = hidden @ proposer.head.T
    temperature = torch.tensor([0.5, 2.0])
    metadata = SimpleNamespace(all_greedy=False, all_random=True, temperature=temperature, generators={},
                               top_k=None, top_p=None)
    capture = proposer.__dict__[ATTR]
    capture.rows = []
    try:
        proposer._sample_draft_tokens(hidden, metadata)
    except Exception:  # vLLM's sampler may want more metadata than this bare object has
        pass
    assert capture.rows, "the feature is recorded before vLLM's sampler runs"
    assert capture.rows[0][0].tolist() == pytest.approx(log_max_prob(logits, temperature).tolist(), rel=1e-5)


def test_not_configured_proposer_runs_vllms_code_untouched(proposer):
    proposer.vllm_config = SimpleNamespace(additional_config=None, speculative_config=None)
    proposer.__dict__.pop(ATTR, None)
    confidence._attach(proposer)
    assert proposer.__dict__.get(ATTR) is None
    hidden = torch.randn(2, 4)
    ids, probs = proposer._sample_draft_tokens(hidden, SimpleNamespace(all_greedy=True, temperature=None))
    assert probs is None and ids.shape == (2,)


def test_a_capture_fault_detaches_the_capture_and_vllm_drafts_on(proposer, caplog):
    capture = proposer.__dict__[ATTR]
    capture.rows = ()  # a bug in the capture: recording into it raises AttributeError
    hidden = torch.randn(2, 4)
    with caplog.at_level("ERROR", logger="vllm.dspark_dynamic"):
        ids, _ = proposer._sample_draft_tokens(hidden, SimpleNamespace(all_greedy=True, temperature=None))
        again, _ = proposer._sample_draft_tokens(hidden, SimpleNamespace(all_greedy=True, temperature=None))
    assert ids.tolist() == again.tolist() == (hidden @ proposer.head.T).argmax(-1).tolist()
    assert proposer.__dict__[ATTR] is None  # detached: vLLM's own code from now on
    assert sum("fault in the plugin" in r.getMessage() for r in caplog.records) == 1
