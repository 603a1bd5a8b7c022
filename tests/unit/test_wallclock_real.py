"""The real-checkpoint benchmark's settings and claims (no engine)."""

from __future__ import annotations

import pytest

from dspark_lab.wallclock import COPY
from dspark_lab.wallclock_real import GROUPS, GroupResult, engine_spec

DRAFTS = {"skip": "/models/skip", "early": "/models/early"}


def spec(name):
    return engine_spec(name, "/models/target", DRAFTS)


def test_every_setting_has_an_engine_and_copies_are_the_same_engine():
    for names in GROUPS.values():
        for name in names:
            assert spec(name) == spec(name.removesuffix(COPY))
            assert spec(name)["engine"]["dtype"] == "float32"


def test_settings_are_what_their_names_say():
    assert "speculative_config" not in spec("plain")
    assert spec("ngram k=4")["speculative_config"]["num_speculative_tokens"] == 4
    assert "additional_config" not in spec("ngram k=4")  # vLLM alone
    assert spec("phase")["additional_config"] == {"dspark_dynamic": {"answer_depth": 2}}
    assert spec("adaptive")["speculative_config"]["method"] == "ngram"
    early = spec("early-draft adaptive (no confidence)")
    assert early["speculative_config"]["model"] == "/models/early"
    assert early["additional_config"]["dspark_dynamic"] == {"policy": "adaptive", "adaptive": {"confidence": False}}
    assert spec("draft_model k=1")["speculative_config"] == {
        "method": "draft_model", "model": "/models/skip", "num_speculative_tokens": 1}
    with pytest.raises(ValueError, match="unknown setting"):
        spec("eagle k=2")


def test_best_fixed_is_the_fastest_fixed_depth_plain_included():
    res = GroupResult(["plain", "ngram k=2", "adaptive", "plain" + COPY])
    res.rounds = [{"plain": {"tokens": 100, "seconds": s}, "ngram k=2": {"tokens": 100, "seconds": 2.0},
                   "adaptive": {"tokens": 100, "seconds": 1.0}, "plain" + COPY: {"tokens": 100, "seconds": 0.1}}
                  for s in (1.0, 1.2, 0.8)]
    assert res.best_fixed() == "plain"  # copies never stand in for their setting
    ratios = res.ratios((("adaptive", "best fixed"), ("adaptive", "ngram k=2")))
    assert ratios["adaptive / best fixed = plain"]["median"] == pytest.approx(1.0)
    assert ratios["adaptive / ngram k=2"]["median"] == pytest.approx(2.0)
    assert ratios["plain (copy) / plain"]["median"] == pytest.approx(10.0)
