import pytest

from dspark_dynamic.core.options import (
    DynamicDepthConfigError,
    parse_options,
    split_alias,
)


def test_defaults():
    opts = parse_options({}, 2)
    assert (opts.reasoning_depth, opts.answer_depth, opts.policy, opts.batch_depth) == (1, 2, "phase", "auto")


def test_round_trip_through_dict():
    assert parse_options({}, 2).skip_idle_drafter
    assert not parse_options({"skip_idle_drafter": False}, 2).skip_idle_drafter
    opts = parse_options({"reasoning_depth": 0, "answer_depth": 1, "reasoning_start_ids": [5], "skip_idle_drafter": False,
                          "reasoning_end_ids": [6, 9], "adaptive": {"window": 100.0}}, 3)
    assert parse_options(opts.to_dict(), 3) == opts


def test_marker_sequences_resets_and_default_phase_round_trip():
    raw = {"reasoning_start_ids": [[7, 8, 9]], "reasoning_end_ids": [[7, 10, 9], 11, [12]],
           "reasoning_reset_ids": [3], "default_phase": "reasoning"}
    opts = parse_options(raw, 2)
    assert opts.reasoning_start_ids == ((7, 8, 9),)
    assert opts.reasoning_end_ids == ((7, 10, 9), 11, 12)  # a one-id list is that id
    assert opts.markers_resolved and parse_options(opts.to_dict(), 2) == opts
    # an end marker alone resolves when reasoning is the default phase
    assert parse_options({"reasoning_end_ids": [4], "default_phase": "reasoning"}, 2).markers_resolved
    assert not parse_options({"reasoning_end_ids": [4]}, 2).markers_resolved


@pytest.mark.parametrize(
    "raw, n, key",
    [
        ({"reasoning_depth": 3}, 2, "reasoning_depth"),
        ({"answer_depth": -1}, 2, "answer_depth"),
        ({"answer_depth": "2"}, 2, "answer_depth"),
        ({"reasoning_depth": True}, 2, "reasoning_depth"),
        ({"policy": "greedy"}, 2, "policy"),
        ({"batch_depth": "mean"}, 2, "batch_depth"),
        ({"think_start_token": ""}, 2, "think_start_token"),
        ({"think_end_token": 5}, 2, "think_end_token"),
        ({"reasoning_start_ids": ["x"]}, 2, "reasoning_start_ids"),
        ({"reasoning_start_ids": [5], "reasoning_end_ids": [5]}, 2, "reasoning_end_ids"),
        ({"reasoning_start_ids": [[5, 6]], "reasoning_end_ids": [[5, 6]]}, 2, "reasoning_end_ids"),
        ({"reasoning_end_ids": [[]]}, 2, "reasoning_end_ids"),
        ({"reasoning_reset_ids": [[1, "x"]]}, 2, "reasoning_reset_ids"),
        ({"default_phase": "thinking"}, 2, "default_phase"),
        ({"reasoning_dept": 1}, 2, "reasoning_dept"),
        ({"adaptive": {"window": 0.5}}, 2, "adaptive.window"),
        ({"adaptive": {"bogus": 1}}, 2, "adaptive.bogus"),
        ({"adaptive": {"context_features": "no"}}, 2, "adaptive.context_features"),
        ({"adaptive": {"confidence": 1}}, 2, "adaptive.confidence"),
        ({"log_interval_s": float("nan")}, 2, "log_interval_s"),
        ({"skip_idle_drafter": "yes"}, 2, "skip_idle_drafter"),
        ({"live_estimate": 1}, 2, "live_estimate"),
        ({"live_estimate": None}, 2, "live_estimate"),
        ("reasoning_depth=1", 2, "dspark_dynamic"),
    ],
)
def test_bad_options_name_the_key(raw, n, key):
    with pytest.raises(DynamicDepthConfigError) as err:
        parse_options(raw, n)
    assert repr(key) in str(err.value) or key in str(err.value)
    assert "allowed" in str(err.value)


def test_needs_speculative_decoding():
    with pytest.raises(DynamicDepthConfigError, match="num_speculative_tokens"):
        parse_options({}, None)


def test_split_alias():
    spec = {"method": "dspark_dynamic", "num_speculative_tokens": 2, "reasoning_depth": 1, "model": "m"}
    vllm_part, ours = split_alias(spec)
    assert vllm_part == {"method": "dspark", "num_speculative_tokens": 2, "model": "m"}
    assert ours == {"reasoning_depth": 1}
    assert spec["method"] == "dspark_dynamic"  # input untouched
    assert split_alias({**spec, "base_method": "draft_model"})[0]["method"] == "draft_model"
    with pytest.raises(DynamicDepthConfigError, match="base_method"):
        split_alias({**spec, "base_method": "dspark_dynamic"})


@pytest.mark.parametrize("knob", ["explore", "hysteresis"])
def test_unknown_adaptive_knobs_are_refused_by_name(knob):
    with pytest.raises(DynamicDepthConfigError, match=f"adaptive.{knob}"):
        parse_options({"policy": "adaptive", "adaptive": {knob: 0.1}}, 2)


@pytest.mark.parametrize("policy", ["vllm-av", "freetoken", "break-even", "p-min"])
def test_the_peers_rules_are_policies(policy):
    assert parse_options({"policy": policy}, 2).policy == policy


def test_context_features_are_on_unless_switched_off():
    assert parse_options({"policy": "adaptive"}, 2).adaptive.context_features is True
    off = parse_options({"policy": "adaptive", "adaptive": {"context_features": False}}, 2)
    assert off.adaptive.context_features is False


def test_the_live_estimate_is_off_unless_asked_for_under_every_policy():
    for policy in ("phase", "adaptive", "vllm-av"):
        assert parse_options({"policy": policy}, 2).live_estimate is False
        on = parse_options({"policy": policy, "live_estimate": True}, 2)
        assert on.live_estimate is True and parse_options(on.to_dict(), 2) == on
    with pytest.raises(DynamicDepthConfigError, match="'live_estimate'='yes'; allowed: true or false"):
        parse_options({"live_estimate": "yes"}, 2)
