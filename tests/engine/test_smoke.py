"""The harness itself: a real vLLM engine on the tiny target, plain vs speculative decoding."""

from dspark_lab.scenarios import BATCHES, EXPECTED, FULL

from conftest import counters_delta


def plain_spec(target):
    return {"model": target, "batches": BATCHES}


def oracle_fixed_spec(target):
    return {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "batches": BATCHES,
    }


def test_plain_engine_follows_the_script(engine, target):
    report = engine("plain", plain_spec(target))
    assert [b["outputs"] for b in report["batches"]] == EXPECTED


def test_oracle_draft_is_lossless_and_fully_accepted(engine, target):
    plain = engine("plain", plain_spec(target))
    spec = engine("oracle_fixed", oracle_fixed_spec(target))
    assert [b["outputs"] for b in spec["batches"]] == [b["outputs"] for b in plain["batches"]]
    c = counters_delta(spec, FULL)
    assert c["drafts"] > 50  # speculative decoding really ran
    assert c["draft_tokens"] == 2 * c["drafts"]  # k=2 on every step
    assert c["accepted_tokens"] == c["draft_tokens"]  # 100 % acceptance
    assert spec["batches"][FULL]["phases"] is None  # plugin installed, not configured: no controller
