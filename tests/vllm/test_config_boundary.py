"""Config alias and validation at EngineArgs -> SpeculativeConfig, before any engine starts."""

import pytest

pytest.importorskip("vllm")

from vllm.engine.arg_utils import EngineArgs  # noqa: E402

from dspark_dynamic.core.options import DynamicDepthConfigError  # noqa: E402
from dspark_dynamic.adapter.patches.config_alias import rewrite_alias  # noqa: E402
from dspark_lab.tiny_models import build_target  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return str(build_target())


def engine_args(model, spec=None, extra=None, **kw):
    return EngineArgs(
        model=model,
        max_model_len=256,
        enforce_eager=True,
        speculative_config=spec,
        additional_config=extra or {},
        **kw,
    )


def test_alias_becomes_dspark_plus_additional_config(model):
    args = engine_args(model, {"method": "dspark_dynamic", "num_speculative_tokens": 2, "reasoning_depth": 1,
                               "answer_depth": 2})
    rewrite_alias(args)
    assert args.speculative_config == {"method": "dspark", "num_speculative_tokens": 2}
    assert args.additional_config == {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2}}


def test_alias_reaches_vllm_as_dspark(model):
    # On CPU vLLM then refuses DSpark itself (it needs Model Runner V2 + a GPU): that error
    # proves vLLM's validation saw method "dspark", not an unknown "dspark_dynamic".
    args = engine_args(model, {"method": "dspark_dynamic", "num_speculative_tokens": 2})
    with pytest.raises(Exception) as err:
        args.create_engine_config()
    assert "dspark" in str(err.value).lower()
    assert "dspark_dynamic" not in str(err.value)
    assert args.speculative_config["method"] == "dspark"


def test_alias_with_base_method_builds_a_config(model):
    args = engine_args(model, {"method": "dspark_dynamic", "base_method": "draft_model", "model": model,
                               "num_speculative_tokens": 2, "reasoning_depth": 0})
    config = args.create_engine_config()
    assert config.speculative_config.method == "draft_model"
    resolved = config.additional_config["dspark_dynamic"]
    assert resolved["reasoning_depth"] == 0 and resolved["answer_depth"] == 2
    assert resolved["reasoning_start_ids"] == [6] and resolved["reasoning_end_ids"] == [7]


def test_alias_and_additional_config_conflict(model):
    args = engine_args(model, {"method": "dspark_dynamic", "num_speculative_tokens": 2, "reasoning_depth": 1},
                       {"dspark_dynamic": {"reasoning_depth": 0}})
    with pytest.raises(DynamicDepthConfigError, match="set both"):
        rewrite_alias(args)


NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


@pytest.mark.parametrize(
    "spec, options, key",
    [
        (NGRAM, {"reasoning_depth": 3}, "reasoning_depth"),
        (NGRAM, {"answer_depth": -1}, "answer_depth"),
        (NGRAM, {"answer_depth": 1.5}, "answer_depth"),
        (NGRAM, {"policy": "magic"}, "policy"),
        (NGRAM, {"batch_depth": "all"}, "batch_depth"),
        (NGRAM, {"typo_key": 1}, "typo_key"),
        (NGRAM, {"think_start_token": "no such token"}, "think_start_token"),
        (NGRAM, {"think_start_token": "<|user|>", "think_end_token": "<|user|>"}, "same token"),
        (None, {"reasoning_depth": 1}, "num_speculative_tokens"),
        (NGRAM, "not a dict", "dspark_dynamic"),
        (NGRAM, {"trace_path": "/no/such/dir/trace.jsonl"}, "trace_path"),
        (NGRAM, {"bound_drafts": "yes"}, "bound_drafts"),
        (NGRAM, {"adaptive": {"draft_token_cost_ratio": -1}}, "adaptive.draft_token_cost_ratio"),
    ],
)
def test_bad_configs_fail_before_the_engine_starts(model, spec, options, key):
    args = engine_args(model, spec, {"dspark_dynamic": options})
    with pytest.raises(DynamicDepthConfigError) as err:
        args.create_engine_config()
    assert key in str(err.value)


@pytest.fixture
def no_think_model(model, tmp_path):
    """The same model, but a tokenizer without <think>/</think> (a model that does not reason)."""
    import json
    import shutil

    d = tmp_path / "nothink"
    shutil.copytree(model, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["added_tokens"] = [t for t in tj["added_tokens"] if "think" not in t["content"]]
    tj["model"]["vocab"] = {k: v for k, v in tj["model"]["vocab"].items() if "think" not in k}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    return str(d)


def test_no_markers_anywhere_runs_in_one_phase(no_think_model):
    args = engine_args(no_think_model, NGRAM, {"dspark_dynamic": {}})
    resolved = args.create_engine_config().additional_config["dspark_dynamic"]
    assert not resolved["reasoning_start_ids"] and not resolved["reasoning_end_ids"]
    assert resolved["default_phase"] == "answer"


def test_a_given_marker_that_does_not_resolve_still_fails(no_think_model):
    args = engine_args(no_think_model, NGRAM, {"dspark_dynamic": {"think_start_token": "f000"}})
    with pytest.raises(DynamicDepthConfigError, match="cannot resolve the think end marker"):
        args.create_engine_config()


@pytest.mark.parametrize(
    "parser, start, end, reset, default",
    [
        ("qwen3", [6], [7], None, "reasoning"),  # qwen3's grammar: <think>, </think>; default reasoning
        ("deepseek_v4", [6], [7], None, "answer"),  # unchanged: no marker means answer
    ],
)
def test_markers_resolve_from_the_reasoning_parser_before_the_engine_starts(model, parser, start, end, reset, default):
    args = engine_args(model, NGRAM, {"dspark_dynamic": {}}, reasoning_parser=parser)
    resolved = args.create_engine_config().additional_config["dspark_dynamic"]
    assert (resolved["reasoning_start_ids"], resolved["reasoning_end_ids"]) == (start, end)
    assert resolved["reasoning_reset_ids"] == reset and resolved["default_phase"] == default


def test_unsupported_reasoning_parser_fails_before_the_engine_starts(model):
    # vLLM's hf parser needs a response_template in the tokenizer; the tiny model has none
    args = engine_args(model, NGRAM, {"dspark_dynamic": {}}, reasoning_parser="hf")
    with pytest.raises(DynamicDepthConfigError, match="reasoning parser 'hf' cannot be used.*response_template"):
        args.create_engine_config()


def test_unconfigured_plugin_leaves_config_alone(model):
    config = engine_args(model, NGRAM).create_engine_config()
    assert "dspark_dynamic" not in (config.additional_config or {})
    assert config.speculative_config.method == "ngram"


def test_adaptive_policy_refused_with_vllms_adaptive_verification(model):
    from types import SimpleNamespace

    from dspark_dynamic.adapter.patches.config_alias import validate

    args = engine_args(model, None, {"dspark_dynamic": {"policy": "adaptive"}})
    spec = SimpleNamespace(method="ngram", num_speculative_tokens=2, enable_adaptive_verification=True)
    target = args.create_model_config()
    with pytest.raises(DynamicDepthConfigError, match="enable_adaptive_verification"):
        validate(args, spec, target)
    args = engine_args(model, None, {"dspark_dynamic": {"policy": "phase"}})
    validate(args, spec, target)  # the phase policy caps what adaptive verification may admit
    assert args.additional_config["dspark_dynamic"]["policy"] == "phase"


@pytest.mark.parametrize("skip_tokenizer_init", [False, True])
def test_marker_ids_outside_the_vocabulary_fail_before_the_engine_starts(model, skip_tokenizer_init):
    # the tiny model's tokenizer and its embedding both hold 256 ids
    args = engine_args(model, NGRAM, {"dspark_dynamic": {"reasoning_start_ids": [4], "reasoning_end_ids": [99999]}},
                       skip_tokenizer_init=skip_tokenizer_init)
    with pytest.raises(DynamicDepthConfigError) as err:
        args.create_engine_config()
    vocabulary = "the model's" if skip_tokenizer_init else "the tokenizer's"
    assert str(err.value) == (f"dspark_dynamic: invalid option 'reasoning_end_ids': token id 99999 is outside "
                              f"{vocabulary} vocabulary of 256 tokens (ids 0..255)")


def test_an_empty_marker_list_fails_before_the_engine_starts(model):
    args = engine_args(model, NGRAM, {"dspark_dynamic": {"reasoning_start_ids": []}})
    with pytest.raises(DynamicDepthConfigError, match=r"'reasoning_start_ids'=\[\]; allowed: at least one marker"):
        args.create_engine_config()
