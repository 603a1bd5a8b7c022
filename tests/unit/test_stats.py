import io
import json

from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.stats import PhaseStats


def test_interval_lines_report_deltas_per_phase():
    stats = PhaseStats()
    stats.record(Phase.REASONING, 1, 0, 1)
    stats.record(Phase.REASONING, 1, 1, 2)
    stats.record(Phase.ANSWER, 2, 2, 3)
    lines = stats.interval_lines()
    assert len(lines) == 2
    assert "[answer]" in lines[0] and "Accepted/Verified draft tokens: 2/2" in lines[0]
    assert "[reasoning]" in lines[1] and "Avg Draft acceptance rate: 50.0%" in lines[1]
    assert stats.interval_lines() == []  # nothing new since
    stats.record(Phase.ANSWER, 0, 0, 1)
    (line,) = stats.interval_lines()
    assert "(+1 at depth 0)" in line


def test_trace_jsonl():
    buf = io.StringIO()
    stats = PhaseStats(trace=buf)
    stats.record(Phase.ANSWER, 2, 1, 2, "req-1")
    stats.record_step_time(0.01, 3, 2, 1, False)
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert rows[0] | {"t": 0} == {"t": 0, "req": "req-1", "phase": "answer", "k": 2, "accepted": 1, "tokens": 2}
    assert rows[1] == {"step_s": 0.01, "verified_tokens": 3, "reqs": 2, "draft_depth": 1, "decode_only": False}
    assert stats.snapshot()["answer"]["accepted_per_pos"] == [1, 0]


def test_a_steps_rows_reach_the_trace_with_its_step_row_or_when_the_engine_idles():
    buf = io.StringIO()
    stats = PhaseStats(trace=buf)
    stats.record(Phase.REASONING, 0, 0, 1, "a")
    stats.record(Phase.ANSWER, 1, 1, 2, "b")
    stats.record_step_time(0.01, 1, 2, 1, True)
    stats.record(Phase.ANSWER, 0, 0, 1, "b")  # a step without timing: written at the next close
    stats.close()
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [r.get("req", "step") for r in rows] == ["a", "b", "step", "b"]
    assert rows[1]["phase"] == "answer" and rows[0]["phase"] == "reasoning"
