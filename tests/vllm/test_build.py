import importlib.util
from types import SimpleNamespace

import pytest

from dspark_dynamic.adapter.build import reasoning_parser_of, resolve_batch_depth
from dspark_dynamic.core.options import parse_options
from dspark_dynamic.core.policy import BatchDepth


class Mode:
    def __init__(self, full):
        self.full = full

    def has_full_cudagraphs(self):
        return self.full


def config(method="dspark", full=True, eager=False, av=False):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(method=method, enable_adaptive_verification=av),
        compilation_config=SimpleNamespace(cudagraph_mode=Mode(full)),
        model_config=SimpleNamespace(enforce_eager=eager),
    )


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (config(), BatchDepth.MAX),  # the fork: DSpark + FULL graphs on uniform-only backends
        (config(full=False), BatchDepth.PER_REQUEST),
        (config(eager=True), BatchDepth.PER_REQUEST),
        (config(method="draft_model"), BatchDepth.PER_REQUEST),  # Model Runner V1
        (config(av=True), BatchDepth.PER_REQUEST),  # 0.33 adaptive verification: varlen graphs
    ],
)
def test_auto_batch_depth(cfg, expected):
    assert resolve_batch_depth(parse_options({}, 2), cfg) is expected


def test_explicit_batch_depth_wins():
    assert resolve_batch_depth(parse_options({"batch_depth": "min"}, 2), config()) is BatchDepth.MIN


def test_reasoning_parser_lookup():
    cfg = SimpleNamespace(reasoning_config=None, structured_outputs_config=SimpleNamespace(reasoning_parser="deepseek_v4"))
    assert reasoning_parser_of(cfg) == "deepseek_v4"
    assert reasoning_parser_of(SimpleNamespace()) is None


def vllm_config(additional, num_spec=2, method="draft_model"):
    return SimpleNamespace(
        additional_config=additional,
        speculative_config=SimpleNamespace(method=method, num_speculative_tokens=num_spec,
                                           enable_adaptive_verification=False),
        compilation_config=SimpleNamespace(cudagraph_mode=Mode(False)),
        model_config=SimpleNamespace(enforce_eager=True, skip_tokenizer_init=True),
        reasoning_config=None,
    )


IDS = {"reasoning_start_ids": [5], "reasoning_end_ids": [6]}


def test_build_controller_is_the_one_way_in(tmp_path):
    from dspark_dynamic.adapter.build import build_controller
    from dspark_dynamic.core.adaptive import AdaptivePolicy
    from dspark_dynamic.core.phase import Phase
    from dspark_dynamic.core.policy import PhasePolicy

    assert build_controller(vllm_config({})) is None  # not configured: nothing is built
    trace = tmp_path / "t.jsonl"
    built = build_controller(vllm_config({"dspark_dynamic": {**IDS, "trace_path": str(trace)}}))
    assert isinstance(built.controller.policy, PhasePolicy)
    assert built.controller.rules.start_ids == {5} and built.controller.rules.end_ids == {6}
    assert built.batch_depth is BatchDepth.PER_REQUEST
    built.controller.stats.record(Phase.ANSWER, 2, 2, 3, "r")
    built.controller.stats.close()  # rows are buffered; the scheduler flushes them whenever it idles
    assert trace.read_text().count("\n") == 1  # the trace file is open
    adaptive = build_controller(vllm_config({"dspark_dynamic": {**IDS, "policy": "adaptive"}}))
    assert isinstance(adaptive.controller.policy, AdaptivePolicy)
    assert "policy=adaptive" in adaptive.describe("draft_model")


def test_trace_path_in_a_missing_directory_fails_with_one_line(tmp_path):
    from dspark_dynamic.adapter.build import build_controller
    from dspark_dynamic.core.options import DynamicDepthConfigError

    bad = str(tmp_path / "missing" / "t.jsonl")
    with pytest.raises(DynamicDepthConfigError) as err:
        build_controller(vllm_config({"dspark_dynamic": {**IDS, "trace_path": bad}}))
    assert "trace_path" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "method, options, async_scheduling, v2, expected",
    [
        ("draft_model", {"policy": "adaptive"}, False, False, "on (draft_model"),
        ("eagle3", {"policy": "adaptive"}, False, False, "on (eagle3"),
        ("eagle3", {"policy": "adaptive"}, False, True, "none (Model Runner V2 hands the plugin confidences of dspark"),
        ("dflash", {"policy": "adaptive"}, False, True, "none (Model Runner V2 hands the plugin confidences of dspark"),
        ("draft_model", {"policy": "adaptive"}, True, False, "none (async scheduling"),
        ("ngram", {"policy": "adaptive"}, False, False, "none (ngram drafts carry no distribution)"),
        ("dspark", {"policy": "adaptive"}, False, True, "on (dspark, Model Runner V2"),
        ("dspark", {"policy": "adaptive"}, True, True, "none (async scheduling"),
        ("draft_model", {"policy": "adaptive", "adaptive": {"confidence": False}}, False, False, "off (adaptive.confidence"),
        ("draft_model", {}, False, False, ""),  # the phase policy never gates on confidences
    ],
)
def test_the_start_up_line_says_whether_confidences_reach_the_policy(method, options, async_scheduling, v2, expected):
    from dspark_dynamic.adapter.build import confidence_status

    cfg = SimpleNamespace(speculative_config=SimpleNamespace(method=method), use_v2_model_runner=v2,
                          scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    status = confidence_status(parse_options(options, 2), cfg)
    assert status.startswith(expected) if expected else status == ""


@pytest.mark.parametrize("method, expected", [("dflash", 0.0), ("dspark", 0.0), ("draft_model", 0.2), ("eagle3", 0.2)])
def test_draft_position_cost_follows_the_drafter_unless_given(method, expected):
    from dspark_dynamic.adapter.build import resolve_draft_cost

    options = parse_options({"policy": "adaptive"}, 2)
    assert options.adaptive.draft_token_cost_ratio is None
    assert resolve_draft_cost(options, method).adaptive.draft_token_cost_ratio == expected
    given = parse_options({"policy": "adaptive", "adaptive": {"draft_token_cost_ratio": 0.05}}, 2)
    assert resolve_draft_cost(given, method).adaptive.draft_token_cost_ratio == 0.05


@pytest.mark.parametrize(
    "method, options, v2, expected",
    [
        ("dflash", {"policy": "adaptive"}, False, True),  # Model Runner V1: context only at depth 0
        ("dflash", {"policy": "adaptive"}, True, False),  # Model Runner V2 runs its drafter anyway
        ("dflash", {"policy": "adaptive", "skip_idle_drafter": False}, False, False),
        ("dspark", {"policy": "adaptive"}, False, False),
        ("draft_model", {"policy": "adaptive"}, False, False),  # skipped and caught up instead
    ],
)
def test_an_idle_dflash_drafter_is_priced_as_not_running_where_it_writes_only_its_context(method, options, v2, expected):
    from dspark_dynamic.adapter.build import build_controller, expects_context_only

    cfg = vllm_config({"dspark_dynamic": {**IDS, **options}}, method=method)
    cfg.use_v2_model_runner = v2
    cfg.scheduler_config = SimpleNamespace(async_scheduling=False)
    if importlib.util.find_spec("vllm.v1.spec_decode.dflash") is None:
        expected = False  # vLLM 0.34: no Model Runner V1, its DFlash drafter runs at depth 0
    assert expects_context_only(parse_options(options, 2), cfg) is expected
    policy = build_controller(cfg).controller.policy
    assert policy.idle_drafter_runs is (not expected and method != "draft_model")
