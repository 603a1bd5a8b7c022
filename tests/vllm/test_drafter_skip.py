"""Skipping an idle draft_model forward: the catch-up inputs against the installed vLLM's own
metadata and slot-mapping code (CPU tensors), and when the skip is refused."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.spec_decode.utils import compute_new_slot_mapping  # noqa: E402

from dspark_dynamic.adapter.patches.drafter_skip import (  # noqa: E402
    ATTR,
    DrafterSkip,
    _SKIP,
    extend_queries,
    skip_wanted,
    why_not_skippable,
)
from dspark_dynamic.core.drafter_lag import Row  # noqa: E402

BLOCK = 4


def step_metadata(starts, lengths, block_table):
    """A decode step's metadata as the runner builds it: queries at ``starts``."""
    qsl = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    seq_lens = torch.tensor([s + n for s, n in zip(starts, lengths)], dtype=torch.int32)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)])
    req = torch.repeat_interleave(torch.arange(len(starts)), torch.tensor(lengths))
    slots = block_table[req, positions // BLOCK] * BLOCK + positions % BLOCK
    cad = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens, num_reqs=len(starts),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(lengths), max_seq_len=int(seq_lens.max()),
        block_table_tensor=block_table, slot_mapping=slots,
    )
    return cad, positions


def test_catch_up_prepends_the_committed_positions_with_their_ids_and_slots():
    block_table = torch.tensor([[7, 3, 9, 0], [2, 5, 8, 6]], dtype=torch.int32)
    token_table = np.arange(2 * 32, dtype=np.int32).reshape(2, 32) + 100  # id = 100 + 32 * row + position
    starts, lengths = [6, 13], [1, 3]
    cad, positions = step_metadata(starts, lengths, block_table)
    ids = torch.tensor([token_table[0, 6], token_table[1, 13], 555, 556], dtype=torch.int32)  # drafts unverified yet
    args = {"target_token_ids": ids, "target_positions": positions, "common_attn_metadata": cad}
    rows = [Row("a", 6, 1), Row("b", 13, 3)]
    proposer = SimpleNamespace(block_size=BLOCK)
    new = extend_queries(proposer, token_table, rows, [2, 5], args)
    nc = new["common_attn_metadata"]
    assert nc.query_start_loc_cpu.tolist() == [0, 3, 11] == nc.query_start_loc.tolist()
    assert new["target_positions"].tolist() == [4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15]
    assert new["target_token_ids"].tolist() == [
        token_table[0, 4], token_table[0, 5], token_table[0, 6],
        *token_table[1, 8:13], token_table[1, 13], 555, 556]
    assert (nc.num_actual_tokens, nc.max_query_len) == (11, 8)
    assert nc.seq_lens.tolist() == cad.seq_lens.tolist()  # only the query grows back
    assert nc.compute_num_computed_tokens().tolist() == [4, 8]
    # the slots are the ones vLLM's own first pass derives from positions and the block table
    vllm_slots = compute_new_slot_mapping(nc, new["target_positions"], torch.zeros(11, dtype=torch.bool),
                                          BLOCK, 0, max_model_len=64)
    assert nc.slot_mapping.tolist() == vllm_slots.tolist()
    assert nc.slot_mapping[:3].tolist() == [3 * BLOCK + 0, 3 * BLOCK + 1, 3 * BLOCK + 2]


class FakeRunner:
    def __init__(self, req_ids, computed, tokens):
        self.input_batch = SimpleNamespace(req_ids=req_ids, num_computed_tokens_cpu=np.array(computed),
                                           token_ids_cpu=tokens)
        self.requests = {r: object() for r in req_ids}


def test_plan_skips_idle_steps_then_catches_up_on_the_next_forward():
    block_table = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.int32)
    tokens = np.arange(64, dtype=np.int32).reshape(1, 64)
    runner = FakeRunner(["a"], [9], tokens)
    state = DrafterSkip(runner)
    proposer = SimpleNamespace(block_size=BLOCK, extra_slots_per_request=1, max_num_tokens=64)

    def args(k, start, length):
        runner.input_batch.num_computed_tokens_cpu = np.array([start])
        cad, positions = step_metadata([start], [length], block_table)
        return {"num_speculative_tokens": k, "common_attn_metadata": cad, "target_positions": positions,
                "target_token_ids": torch.as_tensor(tokens[0, start:start + length])}

    assert state.plan(proposer, args(0, 9, 1)) is _SKIP
    assert state.plan(proposer, args(0, 10, 1)) is _SKIP
    new = state.plan(proposer, args(2, 11, 1))  # drafts again: positions 9, 10 first
    assert new["target_positions"].tolist() == [9, 10, 11]
    assert new["target_token_ids"].tolist() == [9, 10, 11]
    assert state.plan(proposer, args(2, 12, 3)) is None  # in step: vLLM's call as it is
    # a catch-up that would overflow the drafter's token buffer is given up and counted
    assert state.plan(proposer, args(0, 15, 1)) is _SKIP
    proposer.max_num_tokens = 3
    assert state.plan(proposer, args(2, 16, 2)) is None and state.lost_positions == 1


def config(method="draft_model", raw=None, async_scheduling=False, dp=1):
    spec = SimpleNamespace(num_speculative_tokens=2, method=method, uses_draft_model=lambda: method == "draft_model")
    extra = {} if raw is None else {"dspark_dynamic": raw}
    return SimpleNamespace(speculative_config=spec, additional_config=extra,
                           scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
                           parallel_config=SimpleNamespace(data_parallel_size=dp))


def test_the_skip_is_wanted_only_when_configured_and_refused_where_it_cannot_hold():
    assert not skip_wanted(config())  # installed, not configured: nothing changes
    assert skip_wanted(config(raw={}))
    assert not skip_wanted(config(raw={"skip_idle_drafter": False}))
    assert not skip_wanted(config(raw={"bound_drafts": False}))  # the drafter is never asked for 0

    def proposer(cfg, **kw):
        base = dict(vllm_config=cfg, method=cfg.speculative_config.method, pass_hidden_states_to_model=False,
                    parallel_drafting=False, needs_extra_input_slots=True, uses_mrope=False)
        return SimpleNamespace(**{**base, **kw})

    runner = object()
    assert why_not_skippable(proposer(config(raw={})), runner) is None
    assert "draft_model" in why_not_skippable(proposer(config("eagle3", raw={})), runner)
    assert "hidden states" in why_not_skippable(proposer(config(raw={}), pass_hidden_states_to_model=True), runner)
    assert "M-RoPE" in why_not_skippable(proposer(config(raw={}), uses_mrope=True), runner)
    assert "async scheduling" in why_not_skippable(proposer(config(raw={}, async_scheduling=True)), runner)
    assert "data parallel" in why_not_skippable(proposer(config(raw={}, dp=2)), runner)
    assert "runner" in why_not_skippable(proposer(config(raw={})), None)


def test_the_patched_propose_returns_no_drafts_without_the_forward_when_skipping():
    from dspark_dynamic.adapter.patches.drafter_skip import _propose

    calls = []

    def original(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                 next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata, **kw):
        calls.append(target_positions.tolist())
        return torch.zeros(common_attn_metadata.num_reqs, num_speculative_tokens, dtype=torch.int64)

    propose = _propose(original)
    block_table = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.int32)
    tokens = np.arange(64, dtype=np.int32).reshape(1, 64)
    runner = FakeRunner(["a"], [5], tokens)
    drafter = SimpleNamespace(block_size=BLOCK, extra_slots_per_request=1, max_num_tokens=64)
    drafter.__dict__[ATTR] = DrafterSkip(runner)

    def call(k, start):
        runner.input_batch.num_computed_tokens_cpu = np.array([start])
        cad, positions = step_metadata([start], [1], block_table)
        return propose(drafter, k, torch.as_tensor(tokens[0, start:start + 1]), positions, None,
                       torch.tensor([start + 1]), None, cad, None)

    assert call(0, 5).shape == (1, 0) and calls == []
    assert drafter.num_speculative_tokens == 0 and drafter._last_draft_probs is None
    assert call(2, 6).shape == (1, 2) and calls == [[5, 6]]
    drafter.__dict__[ATTR] = None  # detached (or not configured): vLLM's call, forward included
    assert call(0, 7).shape == (1, 0) and calls[-1] == [7]


def test_the_patched_runner_returns_before_preparing_the_drafters_inputs_on_a_skipped_step():
    """The runner's wrapper reads ``common_attn_metadata`` wherever the caller put it (vLLM
    passes it positionally) and skips vLLM's method only when the drafter skips."""
    from dspark_dynamic.adapter.patches.drafter_skip import _runner_propose

    calls = []

    def original(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                 sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                 slot_mappings):
        calls.append(common_attn_metadata.num_reqs)
        state.lag.catch_up(state.rows(common_attn_metadata))  # what the proposer's wrapper does first
        return torch.zeros(common_attn_metadata.num_reqs, scheduler_output.num_spec_tokens_to_schedule)

    propose = _runner_propose(original)
    block_table = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.int32)
    runner = FakeRunner(["a"], [5], np.arange(64, dtype=np.int32).reshape(1, 64))
    runner.drafter = SimpleNamespace()
    runner.drafter.__dict__[ATTR] = state = DrafterSkip(runner)

    def call(k, start, keyword=False):
        runner.input_batch.num_computed_tokens_cpu = np.array([start])
        cad, _ = step_metadata([start], [1], block_table)
        out = SimpleNamespace(num_spec_tokens_to_schedule=k)
        if keyword:
            return propose(runner, out, None, None, None, None, None, None, common_attn_metadata=cad, slot_mappings=None)
        return propose(runner, out, None, None, None, None, None, None, cad, None)

    # a skipped step's drafts: none, as host lists (no device copy, no event to wait on)
    assert call(0, 5) == [] and calls == [] and state.lag.skipped_steps == 1
    assert call(0, 6, keyword=True) == [] and calls == [] and state.lag.skipped_steps == 2
    assert runner._draft_probs is None
    assert call(2, 7).shape == (1, 2) and calls == [1]  # drafts: vLLM's method runs
    assert state.lag.behind("a") is None  # ... and the proposer caught the cache up
    # a step that would leave the request more than max_lag behind runs the forward
    state.lag.max_lag = 2
    assert call(0, 8) == [] and call(0, 9) == [] and calls == [1]  # at most 2 behind
    assert call(0, 10).shape == (1, 0) and calls == [1, 1]  # would be 3 behind: vLLM's method runs
    # nor one whose catch-up would no longer fit the drafter's buffer (besides each row's own query)
    state.lag.max_lag, state.buffer, state.per_row = 100, 8, 4  # room for 8 - 4 = 4 positions
    assert [call(0, p) for p in (11, 12, 13, 14)] == [[], [], [], []] and calls == [1, 1]
    assert call(0, 15).shape == (1, 0) and calls == [1, 1, 1]  # would be 5 behind


def test_the_argument_reader_finds_an_argument_by_position_or_keyword():
    import inspect

    from dspark_dynamic.adapter.patches.drafter_skip import argument_reader

    def method(self, a, b, c=None):
        pass

    read = argument_reader(inspect.signature(method), "b")
    assert read((1, 2), {}) == 2 and read((1,), {"b": 3}) == 3
    with pytest.raises(TypeError, match="'d'"):
        argument_reader(inspect.signature(method), "d")
