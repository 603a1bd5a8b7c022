import random
import time

import pytest

from dspark_dynamic.core.phase import Phase, PhaseRules, RequestPhase

S, E, DSML = 128821, 128822, 128825
RULES = PhaseRules.of([S], [E, DSML])


@pytest.mark.parametrize(
    "tokens, expected",
    [
        ([], Phase.ANSWER),
        ([1, 2, 3], Phase.ANSWER),
        ([1, S], Phase.REASONING),
        ([1, E], Phase.ANSWER),
        ([S, 5, 6], Phase.REASONING),
        ([S, 5, E, 7], Phase.ANSWER),
        # literal markers in history / system text: the last one wins
        ([S, E, S, E, 9, S], Phase.REASONING),
        ([S, 9, E, 9, S, 4, E, 4], Phase.ANSWER),
        # DeepSeek-V4 tool call without </think>: ｜DSML｜ ends reasoning
        ([S, 4, 30, DSML, 72461], Phase.ANSWER),
    ],
)
def test_last_marker_wins(tokens, expected):
    assert RULES.phase_of(tokens) is expected


def test_default_phase_without_markers_is_configurable():
    rules = PhaseRules(frozenset([S]), frozenset([E]), default=Phase.REASONING)
    assert rules.phase_of([1, 2]) is Phase.REASONING


def test_rules_reject_overlapping_or_empty_markers():
    with pytest.raises(ValueError, match="both start and end"):
        PhaseRules.of([S], [S])
    with pytest.raises(ValueError):
        PhaseRules.of([], [E])


def test_marker_found_across_chunk_boundaries():
    rng = random.Random(0)
    for pos in (0, 1, 255, 256, 257, 1023, 1024, 5000, 9999):
        tokens = [rng.randrange(1000) for _ in range(10000)]
        tokens[pos] = S
        assert RULES.last_phase(tokens) is Phase.REASONING, pos
        tokens[pos] = E
        assert RULES.last_phase(tokens) is Phase.ANSWER, pos


def test_far_back_markers_last_one_wins():
    tokens = [7] * 20000
    tokens[10], tokens[20], tokens[30] = S, E, S  # all before the tail window
    assert RULES.last_phase(tokens) is Phase.REASONING
    tokens[40] = DSML
    assert RULES.last_phase(tokens) is Phase.ANSWER
    assert RULES.last_phase([7] * 20000) is None


def test_incremental_matches_full_scan():
    rng = random.Random(1)
    for _ in range(200):
        prompt = [rng.choice([S, E, 1, 2, 3, 4]) for _ in range(rng.randrange(0, 20))]
        output: list[int] = []
        state = RequestPhase(RULES, prompt)
        for _ in range(rng.randrange(1, 15)):
            output.extend(rng.choice([S, E, DSML, 1, 2, 3]) for _ in range(rng.randrange(0, 4)))
            assert state.advance(RULES, output) is RULES.phase_of(prompt + output)


def test_advance_only_reads_new_tokens():
    class CountingList(list):
        reads = 0

        def __getitem__(self, item):
            if isinstance(item, slice):
                CountingList.reads += len(range(*item.indices(len(self))))
            return super().__getitem__(item)

    state = RequestPhase(RULES, [1, S])
    out = CountingList()
    for i in range(1000):
        out.append(i % 7)
        state.advance(RULES, out)
    assert CountingList.reads == 1000  # each token read exactly once
    assert state.phase is Phase.REASONING


def test_shrunk_output_recomputes_from_prompt():
    state = RequestPhase(RULES, [S])
    state.advance(RULES, [1, E, 2])
    assert state.phase is Phase.ANSWER
    assert state.advance(RULES, [1]) is Phase.REASONING


def test_million_token_prompt_scan_is_cheap_when_marker_is_at_the_end():
    prompt = [i % 120_000 for i in range(1_000_000)]  # ids below every marker id
    prompt[-1] = S
    start = time.perf_counter()
    RequestPhase(RULES, prompt)
    # generous bound for a loaded CI machine; the benchmark script prints the real number
    assert time.perf_counter() - start < 0.05
