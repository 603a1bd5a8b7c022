"""One decision per step for the batch: admission and drafting depth (pure logic)."""

import itertools
import random

import pytest

from dspark_dynamic.core.decide import admit, drafting_depth


def brute_force(survivals, v, fixed=0.0):
    best, best_ratio = None, -1.0
    for ks in itertools.product(*(range(len(s) + 1) for s in survivals)):
        tokens = len(survivals) + sum(sum(s[:k]) for s, k in zip(survivals, ks))
        ratio = tokens / (len(survivals) + v * sum(ks) + (fixed if sum(ks) else 0.0))
        if ratio > best_ratio + 1e-12:
            best, best_ratio = list(ks), ratio
    return best, best_ratio


@pytest.mark.parametrize("seed", range(30))
def test_admission_maximises_tokens_per_cost(seed):
    rng = random.Random(seed)
    survivals = []
    for _ in range(rng.randint(1, 4)):
        s, row = 1.0, []
        for _ in range(rng.randint(0, 3)):
            s *= rng.random()
            row.append(s)
        survivals.append(row)
    v = rng.uniform(0.05, 1.5)
    got = admit(survivals, len(survivals), v)
    _, best_ratio = brute_force(survivals, v)
    tokens = len(survivals) + sum(sum(s[:k]) for s, k in zip(survivals, got))
    assert tokens / (len(survivals) + v * sum(got)) == pytest.approx(best_ratio)
    assert all(0 <= k <= len(s) for k, s in zip(got, survivals))


@pytest.mark.parametrize("seed", range(40))
def test_admission_with_a_step_term_maximises_tokens_per_cost(seed):
    """A step that verifies any draft pays ``fixed`` once (draft_model on the testbed): the
    admitted set is still the best one, whether it is empty, one request's or shared."""
    rng = random.Random(100 + seed)
    survivals = []
    for _ in range(rng.randint(1, 4)):
        s, row = 1.0, []
        for _ in range(rng.randint(0, 3)):
            s *= rng.random() ** 0.5
            row.append(s)
        survivals.append(row)
    v, fixed = rng.uniform(0.05, 0.8), rng.uniform(0.0, 1.0)
    got = admit(survivals, len(survivals), v, fixed)
    _, best_ratio = brute_force(survivals, v, fixed)
    tokens = len(survivals) + sum(sum(s[:k]) for s, k in zip(survivals, got))
    cost = len(survivals) + v * sum(got) + (fixed if sum(got) else 0.0)
    assert tokens / cost == pytest.approx(best_ratio)


def test_a_step_term_stops_a_lone_middling_draft_but_is_shared_across_a_batch():
    assert admit([[0.5]], 1, 0.38) == [1]
    assert admit([[0.5]], 1, 0.38, 0.17) == [0]  # 1.5 tokens for 1.55: not worth it
    assert admit([[0.5], [0.5]], 2, 0.38, 0.17) == [1, 1]  # 3 tokens for 2.93
    assert admit([[0.5], [0.5]], 2, 0.38, 0.17, "max") == [1, 1]
    assert admit([[0.5]], 1, 0.38, 0.17, "max") == [0]
    assert admit([[0.9, 0.81]], 1, 0.38, 0.17) == [2]


def test_admission_single_request_threshold():
    # one request: admit draft j while its survival beats v * (tokens so far / cost so far)
    assert admit([[0.9, 0.81]], 1, 0.5) == [2]
    assert admit([[0.4, 0.16]], 1, 0.5) == [0]
    assert admit([[0.6, 0.2]], 1, 0.5) == [1]
    assert admit([], 0, 0.5) == []


def test_uniform_admission_gives_every_request_one_depth():
    survivals = [[0.95, 0.9], [0.3, 0.1], [0.9, 0.2]]
    ks = admit(survivals, 3, 0.5, uniform="max")
    assert len(set(ks)) == 1
    best_k = max(range(3), key=lambda k: (3 + sum(sum(s[:k]) for s in survivals)) / (3 + 0.5 * 3 * k))
    assert ks == [best_k] * 3
    assert admit([[0.9], []], 2, 0.5, uniform="max") == [1, 0]  # capped by the drafts a request has


@pytest.mark.parametrize("uniform", ["max", "min"])
def test_uniform_admission_of_one_request_is_the_best_depth(uniform):
    """One request: the fast path must pick the k with the best T/C, ties toward the deeper k
    under "max" (below, k = 0 and k = 1 tie exactly: 1 / 1 == 1.5 / 1.5)."""
    rng = random.Random(4)
    for _ in range(300):
        s, row = 1.0, []
        for _ in range(rng.randint(0, 4)):
            s *= rng.random()
            row.append(s)
        v = rng.uniform(0.05, 1.5)
        (k,) = admit([row], 1, v, uniform=uniform)
        ratio = lambda k: (1 + sum(row[:k])) / (1 + v * k)  # noqa: E731
        assert ratio(k) == pytest.approx(max(ratio(i) for i in range(len(row) + 1)))
    assert admit([[0.5, 0.25]], 1, 0.5, uniform="max") == [1]
    assert admit([[0.5, 0.25]], 1, 0.5, uniform="min") == [0]




def flat_gains(per_position, share=1.0, verify=0.4):
    """``gains_at`` for requests whose drafts are sure (survival ``s``) or hopeless: gain
    ``(s - rate * verify)^+`` per request and position, summed."""

    def gains_at(rate):
        price = rate * verify
        gains = [sum(max(0.0, s - price) for s in pos) for pos in per_position]
        counts = [sum(1.0 if s > price else 0.0 for s in pos) for pos in per_position]
        any_first = 1.0 if counts and counts[0] else 0.0
        return gains, counts, any_first * share

    return gains_at


def test_drafting_depth_drafts_the_positions_that_pay_for_drafting_and_verifying_them():
    # one request, a plain step of 1: a verified draft costs 0.4, drafting 0.1 per position
    gains = flat_gains([[0.9], [0.8], [0.3]])
    assert drafting_depth(1, 1.0, 0.0, [0.0, 0.1, 0.2, 0.3], gains) == 2
    # drafting costs a whole step: nothing pays for it
    assert drafting_depth(1, 1.0, 0.0, [0.0, 1.0, 1.1, 1.2], gains) == 0
    # with a floor of 1 the drafter runs anyway, and a second position pays its own 0.1
    assert drafting_depth(1, 1.0, 0.0, [0.0, 1.0, 1.1, 1.2], gains, lo=1) == 2
    assert drafting_depth(1, 1.0, 0.0, [0.0, 1.0, 1.1, 1.2], flat_gains([[0.9], [0.2]]), lo=1) == 1


def test_drafting_is_priced_at_what_the_whole_batch_pays():
    """Four requests, one of which would gain from a draft: running the drafter costs the batch's
    step (at four requests a step of 4 units carries 4 tokens), so one request's gain no longer
    pays for it; drafting each request at its own share of the step would."""
    drafting = [0.0, 0.9, 1.0, 1.1]  # the drafter, run for all four, costs 0.9 of a plain step
    one = flat_gains([[0.85, 0.0, 0.0, 0.0]])
    assert drafting_depth(4, 4.0, 0.0, drafting, one) == 0
    alone = flat_gains([[0.85]])
    assert drafting_depth(1, 1.0, 0.0, [0.0, 0.225, 0.25, 0.275], alone) == 1  # the per-request share
    everyone = flat_gains([[0.95] * 4, [0.9] * 4])
    assert drafting_depth(4, 4.0, 0.0, drafting, everyone) == 2


def test_a_first_verified_term_is_paid_once_per_step():
    gains = flat_gains([[0.6]], verify=0.3)
    assert drafting_depth(1, 1.0, 0.0, [0.0, 0.05, 0.1], gains) == 1
    assert drafting_depth(1, 1.0, 0.5, [0.0, 0.05, 0.1], gains) == 0


def test_admission_ranks_drafts_by_survival_per_unit_of_their_own_verify_time():
    """A short-context request's draft (cheap to verify) is admitted before a long-context
    request's draft of higher survival (dear to verify), where only one of them pays."""
    # short: survival 0.5 at 0.1 per draft (5 tokens per unit); long: 0.7 at 0.65 (1.08 per unit):
    # the long one alone would pay (the step's rate is 1), not after the short one (2.5 / 2.1)
    assert admit([[0.7]], 1.0, [0.65]) == [1]
    assert admit([[0.5], [0.7]], 2.0, [0.1, 0.65]) == [1, 0]
    # priced alike, the higher survival comes first and both pay
    assert admit([[0.5], [0.7]], 2.0, [0.1, 0.1]) == [1, 1]
    # the exact best set, against brute force over prefixes, on random batches
    rng = random.Random(7)
    for _ in range(300):
        rows = [sorted((rng.random() for _ in range(rng.randint(0, 3))), reverse=True) for _ in range(3)]
        verify = [rng.uniform(0.02, 1.0) for _ in rows]
        base = rng.uniform(1.0, 3.0)
        got = admit(rows, base, verify)

        def rate(ks):
            return (3 + sum(sum(r[:k]) for r, k in zip(rows, ks))) / (base + sum(v * k for v, k in zip(verify, ks)))

        best = max(rate((a, b, c)) for a in range(len(rows[0]) + 1) for b in range(len(rows[1]) + 1)
                   for c in range(len(rows[2]) + 1))
        assert rate(got) == pytest.approx(best)
    # one depth for all (uniform): verified drafts priced per request
    assert admit([[0.5, 0.4], [0.5, 0.4]], 2.0, [0.05, 2.0], uniform="max") == [0, 0]
    assert admit([[0.5, 0.4], [0.5, 0.4]], 2.0, [0.05, 0.05], uniform="max") == [2, 2]


def test_drafting_prices_each_request_at_its_own_verify_time():
    """Two requests with sure drafts: one cheap to verify, one dear. The drafter drafts where
    the cheap one's gain pays, and deeper only if both would be verified at a shared price."""
    from dspark_dynamic.core.decide import gated_gains

    rows = [[1, [0.9, 0.81], None, None, None, 0.1], [1, [0.9, 0.81], None, None, None, 2.0]]
    gains, counts, share = gated_gains(rows, 2, 0.5)  # rate 0.5 tokens/unit: prices 0.05 and 1.0
    assert counts == [1.0, 1.0] and share == 1.0
    assert gains == pytest.approx([0.85, 0.76])
