"""The benchmark's pictures: drawn from a summary and controller trace rows (matplotlib extra)."""

import json

import pytest

pytest.importorskip("matplotlib")

from dspark_lab.plots import plot_wallclock, request_timeline  # noqa: E402


def trace_text():
    rows = [{"req": "a", "phase": "reasoning", "k": 1, "accepted": i % 2, "tokens": 1 + i % 2} for i in range(5)]
    rows += [{"step_s": 0.01, "verified_tokens": 1, "reqs": 1, "draft_depth": 1, "decode_only": True}]
    rows += [{"req": "b", "phase": "answer", "k": 2, "accepted": 2, "tokens": 3} for _ in range(3)]
    return "\n".join(json.dumps(r) for r in rows)


def test_timeline_takes_one_requests_rows():
    assert [r["req"] for r in request_timeline(trace_text())] == ["b"] * 3  # the last request
    assert len(request_timeline(trace_text(), 0)) == 5
    assert request_timeline("") == []


def test_plot_is_written(tmp_path):
    stats = {"median": 10.0, "q1": 9.0, "q3": 11.0, "n": 3}
    summary = {"tok_per_s": {n: {"all": stats, "reasoning": stats, "answer": stats} for n in ("fixed k=2", "phase 1/2")}}
    out = tmp_path / "p.png"
    plot_wallclock(summary, {"phase 1/2": trace_text()}, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_reliability_diagram_from_the_calibration_reports(tmp_path):
    import random

    from dspark_dynamic.core.confidence import ConfidenceCalibrator
    from dspark_lab.plots import confidence_reports

    cal = ConfidenceCalibrator(1)
    rng = random.Random(0)
    for _ in range(2000):
        right = rng.random() < 0.5
        cal.observe([rng.gauss(2.0 if right else -1.0, 1.5)], 1, int(right))
    stats = {"median": 10.0, "q1": 9.0, "q3": 11.0, "n": 3}
    summary = {"tok_per_s": {"adaptive": {"all": stats, "reasoning": stats, "answer": stats}},
               "checks": {"adaptive: confidence": {"reasoning": cal.report.to_dict()}, "adaptive: phases": {}}}
    assert list(confidence_reports(summary)) == ["adaptive"]
    points = cal.report.reliability()
    assert len(points) > 5 and all(abs(pred - obs) < 0.2 for pred, obs, n in points if n > 50)
    with_diagram, without = tmp_path / "a.png", tmp_path / "b.png"
    plot_wallclock(summary, {}, str(with_diagram))
    plot_wallclock({"tok_per_s": summary["tok_per_s"]}, {}, str(without))
    assert with_diagram.stat().st_size > without.stat().st_size  # the diagram is drawn
