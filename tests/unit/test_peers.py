"""The peers' depth rules (pure logic): each does what its source describes."""

import math

import pytest

from dspark_dynamic.core import peers
from dspark_dynamic.core.acceptance import logit
from dspark_dynamic.core.options import PEER_POLICIES
from dspark_dynamic.core.peers import PEERS, BreakEvenPause, FreeTokenWidth, PMin, VllmAdaptiveVerification
from dspark_dynamic.core.phase import Phase

R, A = Phase.REASONING, Phase.ANSWER


def identity_calibration(peer):
    """Calibrators that read a feature as its own log-odds (probability = sigmoid(feature))."""
    for cal in peer.calibrators.values():
        cal.theta = [1.0] + [0.0] * peer.n


def profile(peer, step_s):
    """Run a peer's start-up profile: ``step_s(requests, verified)`` seconds per step."""
    for _ in range(16 + peers.PROFILE_STEPS + 1):
        items = [(R, "a", [3.0, 3.0], 2)]
        depths = peer.gate(items)
        peer.observe_step(step_s(1, sum(depths)), sum(depths), 1, 2)


def test_every_peer_is_a_policy_option():
    assert set(PEERS) == set(PEER_POLICIES)


def test_vllm_av_profiles_its_step_costs_then_admits_the_best_tokens_per_second():
    av = VllmAdaptiveVerification(2)
    identity_calibration(av)
    profile(av, lambda r, v: 0.010 + 0.006 * v)
    assert not av.profile.profiling and set(av.profile.table) == {1, 2, 3}
    # survivals 0.9, 0.81: (1 + 0.9 + 0.81) / 22 ms beats (1 + 0.9) / 16 and 1 / 10
    assert av.gate([(R, "b", [logit(0.9), logit(0.9)], 2)]) == [2]
    # survivals 0.5, 0.25: 1 / 10 ms beats 1.5 / 16 and 1.75 / 22
    assert av.gate([(R, "c", [0.0, 0.0], 2)]) == [0]
    # the budget is global: the slots of the surer request come first
    assert av.gate([(R, "d", [logit(0.95), 0.0], 2), (R, "e", [0.0, 0.0], 2)]) == [1, 0]


def test_vllm_av_smooths_each_requests_confidences_with_an_ema_on_the_old_value():
    av = VllmAdaptiveVerification(2)
    identity_calibration(av)
    av.profile.table = {1: 0.010, 2: 0.011, 3: 0.012}
    av.gate([(R, "a", [logit(0.9), logit(0.9)], 2)])
    av.gate([(R, "a", [logit(0.1), logit(0.1)], 2)])
    assert av.smoothed["a"] == pytest.approx([0.8 * 0.9 + 0.2 * 0.1] * 2)
    av.forget("a")
    assert "a" not in av.smoothed


def test_freetoken_verifies_the_width_with_the_most_tokens_per_second_measured():
    ft = FreeTokenWidth(2)
    identity_calibration(ft)
    profile(ft, lambda r, v: 0.010 + 0.006 * v)
    assert ft.gate([(R, "b", [logit(0.9), logit(0.9)], 2)]) == [2]
    assert ft.gate([(R, "c", [0.0, 0.0], 2)]) == [0]
    two = [(R, "d", [logit(0.95), logit(0.95)], 2), (R, "e", [0.0, 0.0], 2)]
    assert len(set(ft.gate(two))) == 1  # one width for the batch


def test_break_even_pauses_where_speculation_does_not_pay_and_tries_again():
    be = BreakEvenPause(2)
    plain = 0.010
    for _ in range(BreakEvenPause.WINDOW):  # it measures plain steps first
        assert be.plan([(R, "a")]) == [0]
        be.observe_step(plain, 0, 1, 0)
    assert be.plan([(R, "a")]) == [2]
    for _ in range(BreakEvenPause.WINDOW):  # speculating: +8 ms a step, one token saved every other step
        be.observe(R, 2, 0, "a")
        be.observe_step(plain + 0.008, 2, 1, 2)
    assert [be.plan([(R, "a")])[0] for _ in range(1)] == [0]  # paused
    for _ in range(BreakEvenPause.SKIP):
        be.observe_step(plain, 0, 1, 0)
    assert be.plan([(R, "a")]) == [2]  # and speculating again
    for _ in range(BreakEvenPause.WINDOW):  # now it pays: 2 tokens saved for 6 ms more
        be.observe(R, 2, 2, "a")
        be.observe_step(plain + 0.006, 2, 1, 2)
    assert be.plan([(R, "a")]) == [2]


def test_p_min_verifies_up_to_the_first_draft_below_the_threshold():
    pm = PMin(3)
    sure, doubtful = logit(0.8), logit(0.7)
    assert pm.gate([(R, "a", [sure, sure, doubtful], 3), (R, "b", [doubtful, sure, sure], 3)]) == [2, 0]
    assert math.isclose(1 / (1 + math.exp(-sure)), 0.8)
    assert pm.plan([(R, "a")]) == [3]
