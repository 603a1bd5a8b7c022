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


# --- multi-token markers (harmony-style channel headers sharing tokens) and resets ---------
C, AN, FI, CO, M, ST = 50, 51, 52, 53, 54, 55  # <|channel|> analysis final commentary <|message|> <|start|>
SEQ = PhaseRules.of([(C, AN, M)], [(C, FI, M), (C, CO)], reset=[ST], default=Phase.REASONING)


def brute_phase(tokens, default=Phase.REASONING):
    """Reference: walk forward, the last complete marker wins."""
    phase = default
    for i in range(len(tokens)):
        if tokens[max(0, i - 2) : i + 1] == [C, AN, M]:
            phase = Phase.REASONING
        elif tokens[max(0, i - 2) : i + 1] == [C, FI, M] or tokens[max(0, i - 1) : i + 1] == [C, CO]:
            phase = Phase.ANSWER
        elif tokens[i] == ST:
            phase = default
    return phase


@pytest.mark.parametrize(
    "tokens, expected",
    [
        ([1, C, AN, M, 2], Phase.REASONING),
        ([C, AN, M, 2, C, FI, M, 3], Phase.ANSWER),
        ([C, FI, M, 3, ST, 7], Phase.REASONING),  # a new message resets to the default
        ([C, FI, 3, M], Phase.REASONING),  # broken header: no marker at all
        ([C, AN, M, C, CO, 9], Phase.ANSWER),
        ([FI, M, 2], Phase.REASONING),  # the tail of a marker alone is nothing
    ],
)
def test_sequence_markers(tokens, expected):
    assert SEQ.phase_of(tokens) is expected
    assert brute_phase(tokens) is expected


def test_sequence_rules_take_the_single_path_only_without_sequences():
    assert SEQ.lookback == 2 and RULES.lookback == 0
    assert PhaseRules.of([[S]], [[E]]) == PhaseRules.of([S], [E])  # one-token sequences are ids


def test_sequence_split_across_steps_and_prompt_at_every_cut():
    stream = [ST, 9, C, AN, M, 1, 2, C, 3, C, FI, M, 4, C, AN, M, 5, C, CO, 6]
    for cut in range(len(stream)):
        prompt, output = stream[:cut], stream[cut:]
        rng = random.Random(cut)
        state = SEQ.track(type("R", (), {"prompt_token_ids": prompt})())
        assert state.phase is brute_phase(prompt)
        fed = 0
        while fed < len(output):
            fed = min(len(output), fed + rng.randint(1, 3))
            assert state.advance(SEQ, output[:fed]) is brute_phase(stream[: cut + fed]), (cut, fed)


def test_sequence_incremental_matches_reference_on_random_streams():
    rng = random.Random(3)
    alphabet = [C, AN, FI, CO, M, ST, 1, 2]
    for _ in range(300):
        prompt = [rng.choice(alphabet) for _ in range(rng.randrange(0, 12))]
        state = RequestPhase(SEQ, prompt)
        output: list[int] = []
        for _ in range(rng.randrange(1, 12)):
            output.extend(rng.choice(alphabet) for _ in range(rng.randrange(0, 4)))
            assert state.advance(SEQ, output) is brute_phase(prompt + output)
        del output[rng.randrange(0, len(output) + 1):]  # rolled back
        assert state.advance(SEQ, output) is brute_phase(prompt + output)


def test_sequence_advance_reads_new_tokens_plus_lookback():
    reads = []

    class Recording(list):
        def __getitem__(self, item):
            if isinstance(item, slice):
                reads.append(len(range(*item.indices(len(self)))))
            return super().__getitem__(item)

    state = RequestPhase(SEQ, [C, AN, M])
    out = Recording()
    for i in range(1000):
        out.append(7 + i % 3)
        state.advance(SEQ, out)
    assert max(reads) <= 1 + SEQ.lookback and state.phase is Phase.REASONING


def test_sequence_far_back_in_a_long_prompt():
    tokens = [7] * 50_000
    tokens[100:103] = [C, FI, M]
    tokens[30_000] = M  # a lone last token: a candidate, not a marker
    assert SEQ.last_phase(tokens) is Phase.ANSWER
    tokens[40_000:40_003] = [C, AN, M]
    assert SEQ.last_phase(tokens) is Phase.REASONING
    assert SEQ.last_phase([7] * 50_000) is None


def test_sequence_rules_reject_contradictions():
    with pytest.raises(ValueError, match="both a start and an end"):
        PhaseRules.of([(C, AN, M)], [(C, AN, M)])
    with pytest.raises(ValueError, match="end marker"):
        PhaseRules.of([(C, AN, M)], [], default=Phase.REASONING)
    with pytest.raises(ValueError, match="start marker unless"):
        PhaseRules.of([], [(C, FI, M)])  # default answer and no way into reasoning
    assert PhaseRules.of([], [(C, FI, M)], default=Phase.REASONING).phase_of([1]) is Phase.REASONING
