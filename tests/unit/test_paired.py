import pytest

from dspark_lab.paired import paired_ratio, rotation, summarize


def test_summary_is_median_and_quartiles():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.median, s.q1, s.q3, s.n) == (3.0, 2.0, 4.0, 5)
    assert summarize([7.0]).as_dict() == {"median": 7.0, "q1": 7.0, "q3": 7.0, "n": 1}
    with pytest.raises(ValueError):
        summarize([])


def test_paired_ratio_cancels_a_shared_round_effect():
    # the machine is twice as slow in round 2 for both settings: the paired ratio does not notice
    a = [110.0, 55.0, 112.0]
    b = [100.0, 50.0, 100.0]
    assert paired_ratio(a, b).median == pytest.approx(1.1)
    assert summarize(a).median / summarize(b).median == pytest.approx(1.1)  # same here, but ...
    assert paired_ratio([110.0, 55.0, 60.0], [100.0, 50.0, 50.0]).median == pytest.approx(1.1)
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_rotation_gives_every_setting_every_slot():
    names = ["a", "b", "c"]
    orders = [rotation(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for slot in range(3):
        assert {o[slot] for o in orders} == set(names)


def test_wallclock_claims_resolve_the_better_baseline():
    from dspark_lab.wallclock import WallclockResult

    result = WallclockResult(["fixed k=1", "fixed k=2", "phase 1/2", "adaptive"])
    seconds = {"fixed k=1": 1.0, "fixed k=2": 1.3, "phase 1/2": 1.1, "adaptive": 1.05}
    for _ in range(3):
        result.rounds.append({n: {"tokens": {"reasoning": 100, "answer": 50},
                                  "seconds": {"reasoning": s, "answer": 0.5}, "steps": 10}
                              for n, s in seconds.items()})
    ratios = result.summary()["ratios"]
    best = ratios["adaptive / best of fixed k=1|phase 1/2 = fixed k=1"]  # k=1 is faster here
    assert best["median"] == pytest.approx(1.5 / 1.55)
    assert ratios["phase 1/2 / fixed k=2"]["median"] == pytest.approx(1.8 / 1.6)


def test_a_copy_setting_is_the_same_engine_twice_and_reports_its_ratio(tmp_path, monkeypatch):
    """``"<setting> (copy)"``: an A/A check of the benchmark (same spec, its own trace file)."""
    from dspark_lab import wallclock

    monkeypatch.setattr(wallclock, "testbed_models", lambda shape, drafter: ("target", {"method": "draft_model"}))
    specs = wallclock.engine_specs(("adaptive", "adaptive (copy)", "fixed k=1 (copy)"), tmp_path)
    a, b = specs["adaptive"], specs["adaptive (copy)"]
    assert a["additional_config"]["dspark_dynamic"].pop("trace_path") != b["additional_config"]["dspark_dynamic"].pop("trace_path")
    assert a == b and specs["fixed k=1 (copy)"]["speculative_config"]["num_speculative_tokens"] == 1
    result = wallclock.WallclockResult(["phase 1/2", "phase 1/2 (copy)"])
    for s in (1.0, 1.1, 0.9):
        result.rounds.append({n: {"tokens": {"reasoning": 100, "answer": 50},
                                  "seconds": {"reasoning": s * f, "answer": 0.5}, "steps": 10}
                              for n, f in (("phase 1/2", 1.0), ("phase 1/2 (copy)", 1.02))})
    ratio = result.summary()["ratios"]["phase 1/2 (copy) / phase 1/2"]["median"]
    assert ratio == pytest.approx(1.5 / 1.52)


def test_controlled_engines_write_no_trace_unless_asked(monkeypatch):
    """Speed runs as a user runs: a trace costs the controlled engines host time every step."""
    from dspark_lab import wallclock

    monkeypatch.setattr(wallclock, "testbed_models", lambda shape, drafter: ("target", {"method": "draft_model"}))
    specs = wallclock.engine_specs(("adaptive", "phase 1/2", "fixed k=2"), None)
    assert specs["adaptive"]["additional_config"]["dspark_dynamic"] == {"policy": "adaptive"}
    assert specs["phase 1/2"]["additional_config"]["dspark_dynamic"] == {"reasoning_depth": 1, "answer_depth": 2}
    assert "additional_config" not in specs["fixed k=2"]


def test_each_setting_starts_in_every_place_once_over_as_many_epochs():
    """Fresh engines per epoch start in a rotated order: a setting that always started in the
    middle (as under a reversal, with three settings or more) would carry that place's speed."""
    from dspark_lab.wallclock import start_order

    settings = ("fixed k=0", "fixed k=0 (copy)", "phase 0/0", "adaptive")
    orders = [start_order(settings, e) for e in range(len(settings))]
    assert all(sorted(o) == sorted(settings) for o in orders)
    for name in settings:
        assert sorted(o.index(name) for o in orders) == list(range(len(settings)))
    assert start_order(("a", "b"), 1) == ("b", "a") and start_order(settings, 4) == settings
