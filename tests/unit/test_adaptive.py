import copy
import math
import random

import pytest

from dspark_dynamic.core.adaptive import (
    AcceptanceEstimate,
    AdaptivePolicy,
    GatedGain,
    Persistence,
    StepCostModel,
    best_depth,
    expected_tokens,
)
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.simulate import CostModel, bimodal_trace, compare, drift_trace, seed_like_trace

R, A = Phase.REASONING, Phase.ANSWER


def calibrate(policy: AdaptivePolicy, phase: Phase, theta: list[float]) -> None:
    """Give a phase's calibrator these coefficients, as if learned: the gate trusts it at once
    (``MIN_LABELS`` waived)."""
    policy.calibrators[phase].theta = list(theta)
    policy.MIN_LABELS = 0


def feed(estimate_or_policy, p, steps, k, rng, phase=R, req=None):
    for _ in range(steps):
        m = 0
        while m < k and rng.random() < p:
            m += 1
        if isinstance(estimate_or_policy, AcceptanceEstimate):
            estimate_or_policy.update(k, m)
        else:
            estimate_or_policy.observe(phase, k, m, req)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9])
def test_estimator_converges_per_position(p):
    est = AcceptanceEstimate(positions=3, window=2000)
    feed(est, p, 20000, 3, random.Random(0))
    rates = est.rates([], prior_weight=20)
    assert rates == pytest.approx([p, p, p], abs=0.03)


def test_estimator_follows_a_change_within_its_window():
    est = AcceptanceEstimate(positions=1, window=200)
    rng = random.Random(1)
    feed(est, 0.9, 3000, 1, rng)
    feed(est, 0.2, 1000, 1, rng)
    assert est.rates([], 20)[0] == pytest.approx(0.2, abs=0.06)


def test_unobserved_positions_borrow_their_predecessor():
    est = AcceptanceEstimate(positions=3, window=1000)
    feed(est, 0.8, 500, 1, random.Random(2))  # only position 1 is ever observed
    r = est.rates([], 20)
    assert r[1] == pytest.approx(r[0]) and r[2] == pytest.approx(r[0])


@pytest.mark.parametrize(
    "rates, draft_ratio, verify_ratio, expected",
    [
        ([0.1, 0.1, 0.1], 0.04, 0.5, 0),  # hard drafts: do not verify
        ([0.525, 0.525, 0.525], 0.04, 0.503, 1),  # the seed's reasoning: 1 draft
        ([0.949, 0.949], 0.04, 0.503, 2),  # the seed's answer with N=2
        ([0.949, 0.949, 0.949], 0.04, 0.503, 3),  # ... and with N=3
        ([0.6, 0.6, 0.6], 0.0, 0.01, 3),  # verification almost free (a GPU): go deep
        ([0.9, 0.9, 0.9], 0.04, 5.0, 0),  # verification very expensive: stop
    ],
)
def test_best_depth_is_the_analytic_optimum(rates, draft_ratio, verify_ratio, expected):
    k, scores = best_depth(rates, 0, len(rates), StepCostModel(verify_ratio, draft_ratio).per_token)
    brute = max(range(len(rates) + 1), key=lambda i: expected_tokens(rates, i) / (1 + draft_ratio + verify_ratio * i))
    assert k == brute == expected
    assert scores[k] == max(scores)


def test_expected_tokens():
    assert expected_tokens([0.5, 0.5], 0) == 1
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)


def make_policy(**kw):
    args = dict(verify_cost_ratio=0.503, draft_cost_ratio=0.04, learn_cost=False, explore=0.0)
    args.update(kw)
    return AdaptivePolicy(2, {R: 1, A: 2}, **args)


def test_phase_defaults_until_there_is_evidence():
    policy = make_policy(prior_weight=20)
    assert policy.depth(R, "x") == 1 and policy.depth(A, "x") == 2
    feed(policy, 0.05, 19, 1, random.Random(3), R, "x")
    assert policy.depth(R, "x") == 1  # 19 < 20 observations
    feed(policy, 0.05, 5, 1, random.Random(4), R, "x")
    assert policy.depth(R, "x") == 0  # evidence: drafts are useless here


def test_hysteresis_needs_a_clear_gain_before_leaving_the_current_depth():
    # k=1 vs k=2 tie at a = 0.757 with these costs; at a = 0.73, k=1 is better by ~1.5 %
    _, scores = best_depth([0.757, 0.757], 0, 2, 0.503 / 1.04)
    assert scores[1] == pytest.approx(scores[2], rel=1e-3)
    chosen = {}
    for hysteresis in (0.0, 0.05):
        policy = make_policy(hysteresis=hysteresis, prior_weight=1, window=1e9)
        for i in range(1000):  # deterministic stream with a1 = a2 = 0.73
            first = (i * 73) % 100 < 73
            second = first and ((i * 37) % 100 < 73)
            policy.observe(A, 2, int(first) + int(second), None)
        rates = policy.phase_rates(A)
        k, scores = best_depth(rates, 0, 2, 0.503 / 1.04)
        assert k == 1 and 1.0 < scores[1] / scores[2] < 1.05
        chosen[hysteresis] = policy.depth(A, "r")  # the request starts at answer_depth = 2
    assert chosen == {0.0: 1, 0.05: 2}


def test_exploration_rate_and_direction():
    policy = make_policy(explore=0.1, prior_weight=1)
    feed(policy, 0.02, 200, 1, random.Random(6), R, "x")  # chosen depth 0
    ks = [policy.depth(R, "x") for _ in range(5000)]
    assert ks.count(1) / len(ks) == pytest.approx(0.1, abs=0.02)  # one deeper, 10 % of steps
    assert set(ks) == {0, 1}
    assert make_policy(explore=0.0).explore == 0.0


def test_persistence_separates_independent_from_streaky_outcomes():
    rng = random.Random(7)
    iid, streaky = Persistence(2000), Persistence(2000)
    prev = 0.0
    for _ in range(5000):
        cur = float(rng.random() < 0.5)
        iid.add(prev, cur)
        prev = cur
    state = 1.0
    for _ in range(5000):
        if rng.random() < 0.02:
            state = 1.0 - state
        streaky.add(state, state)
    assert iid.rho() < 0.1 < 0.8 < streaky.rho()
    assert iid.blend() > 10 * streaky.blend()


def test_sequential_drafting_cost_moves_the_optimum():
    """A drafter that pays per drafted position (draft_model, EAGLE) makes deep drafts dearer
    than a parallel one (DSpark) at the same acceptance."""
    rates = [0.949, 0.949]
    parallel = StepCostModel(0.503, 0.04, draft_token=0.0)
    sequential = StepCostModel(0.503, 0.04, draft_token=1.0)
    assert best_depth(rates, 0, 2, parallel.per_token)[0] == 2
    assert best_depth(rates, 0, 2, sequential.per_token)[0] == 0


def idle_free_steps(model, rng, n, t0=0.010, t_req=0.002, d=0.005, c=0.001, noise=0.0005, outliers=0.0):
    for _ in range(n):
        reqs = rng.choice([1, 1, 2, 4])
        k = rng.choice([0, 1, 2, 3])
        draft = max(k, rng.choice([0, 1, 2, 3]))
        seconds = t0 + t_req * reqs + d * k * reqs + c * draft + rng.gauss(0, noise)
        if rng.random() < outliers:  # a shared machine: now and then a step is stalled
            seconds *= 8
        model.update(seconds, k * reqs, reqs, draft)


def test_cost_model_learns_per_token_cost_without_being_fooled_by_batch_size_or_stalls():
    model = StepCostModel(verify=5.0, draft=0.0, learn=True, forget=0.999)
    assert model.learned() is None and model.per_token == 5.0  # no data: the prior
    rng = random.Random(8)
    idle_free_steps(model, rng, 3000, outliers=0.03)
    base = (0.010 + 0.002 * model.requests) / model.requests
    assert model.learned() == pytest.approx((0.005 + 0.001) / base, rel=0.15)
    assert model.per_token == model.learned()


def test_cost_model_needs_several_depths_and_can_be_told_not_to_learn():
    one_depth = StepCostModel(0.5, 0.04)
    for _ in range(200):
        one_depth.update(0.02, 1, 1, 1)
    assert one_depth.learned() is None  # a single depth says nothing about the slope
    fixed = StepCostModel(0.5, 0.04, learn=False)
    idle_free_steps(fixed, random.Random(1), 500)
    assert fixed.per_token == pytest.approx(0.5 / 1.04)


def test_forget_frees_request_state():
    policy = make_policy()
    policy.depth(R, "a")
    policy.observe(R, 1, 1, "a")
    policy.forget("a")
    assert policy.requests == {}


# -- the simulator's acceptance numbers (printed by scripts/simulate.py) ----------------------

COST = CostModel(t0_ms=75.0, draft_ms=3.0, verify_ms=37.75)


def results(trace):
    return {r.name: r.tok_per_s for r in compare(trace, COST)}


def test_seed_trace_adaptive_ge_phase_ge_108_fixed2():
    res = results(seed_like_trace())
    assert res["adaptive (k<=3)"] >= res["phase 1/2"] >= 1.08 * res["fixed k=2"]


def test_bimodal_trace_adaptive_within_5_percent_of_oracle():
    res = results(bimodal_trace())
    assert res["adaptive (k<=3)"] >= 0.95 * res["oracle per step"]
    assert res["oracle per step"] <= res["hindsight bound"]


def test_recorded_controller_trace_replays(tmp_path):
    import json

    from dspark_dynamic.core.simulate import load_trace

    rows = []
    for i in range(300):  # reasoning: 1 draft, accepted every other step; answer: 2 drafts, all accepted
        rows.append({"req": "a", "phase": "reasoning", "k": 1, "accepted": i % 2, "tokens": 1 + i % 2})
    for _ in range(100):
        rows.append({"req": "a", "phase": "answer", "k": 2, "accepted": 2, "tokens": 3})
    rows.append({"step_s": 0.1, "verified_tokens": 2, "reqs": 1})  # engine-step rows are skipped
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    (positions,) = load_trace(str(path))
    reasoning = [p for p in positions if p[0] is R]
    answer = [p for p in positions if p[0] is A]
    assert len(reasoning) == 450 and len(answer) == 300  # recorded tokens per phase
    assert reasoning[0][2][0] == pytest.approx(0.5)  # recorded first-draft acceptance
    assert answer[0][2][:2] == (1.0, 1.0)
    res = {r.name: r for r in compare([positions], COST, max_k=2)}
    for result in res.values():  # every policy replays the whole request (the last step may overshoot)
        assert len(positions) <= result.tokens <= len(positions) + 2


def test_per_position_trace_format(tmp_path):
    from dspark_dynamic.core.simulate import load_trace

    path = tmp_path / "t.jsonl"
    path.write_text('{"req": "x", "phase": "reasoning", "L": 0}\n{"req": "x", "phase": "answer", "L": 3}\n')
    assert [(p[0], p[1]) for p in load_trace(str(path))[0]] == [(R, 0), (A, 3)]


def test_drift_trace_adaptive_follows_each_request():
    """Acceptance 100 % in the first half of reasoning, 0 % in the second; the costs given
    (T0 75 ms, c_draft 3 ms, d 37.75 ms; learn_cost off).  Adaptive must beat the phase policy by
    10 % and reach 95 % of a per-step oracle that knows which drafts will be accepted."""
    res = {r.name: r.tok_per_s for r in compare(drift_trace(), COST, max_k=2, adaptive_n=2)}
    assert res["adaptive (k<=2)"] >= 1.10 * res["phase 1/2"]
    assert res["adaptive (k<=2)"] >= 0.95 * res["hindsight bound"]


def test_adaptive_climbs_one_depth_per_step():
    policy = make_policy(prior_weight=1.0)
    for _ in range(50):  # the request's drafts all fail: it parks at depth 0
        policy.observe(R, 1, 0, "a")
        policy.depth(R, "a")
    assert policy.depth(R, "a") == 0
    for _ in range(400):  # now they all succeed (phase-wide): it climbs 0 -> 1 -> 2, never 0 -> 2
        policy.observe(R, 2, 2, None)
    seen = [policy.depth(R, "a") for _ in range(3)]
    assert seen[0] == 1 and seen[1:] == [2, 2]


# -- draft confidences ------------------------------------------------------------------------

from dspark_dynamic.core.simulate import ConfidenceModel, draft_features, hindsight_depth, oracle_depth, replay, replay_confident  # noqa: E402


def confident(trace, model, n=2):
    return replay_confident(trace, draft_features(trace, model, n), COST, n, 1, 2).tok_per_s


def reference(trace, name):
    if name == "phase":
        return replay(trace, name, lambda r, pos: 1 if pos[0] is R else 2, COST).tok_per_s
    if name == "hindsight":
        return replay(trace, name, lambda r, pos: hindsight_depth(pos[1], COST, 2), COST).tok_per_s
    return replay(trace, name, lambda r, pos: oracle_depth(pos[2], COST, 2), COST).tok_per_s


@pytest.mark.parametrize("workload", ["chain", "drift"])
def test_confidence_of_auc_085_beats_phase_by_8_percent(workload):
    """Seed cost model, per-draft confidences of ROC-AUC 0.85 (the DSpark head's range): the chain
    (seed-like, independent positions) and the drift workload (all accepted, then none)."""
    trace = seed_like_trace() if workload == "chain" else drift_trace()
    model = ConfidenceModel.with_auc(0.85)
    assert model.auc == pytest.approx(0.85, abs=1e-6)
    tok_s = confident(trace, model)
    assert tok_s >= 1.08 * reference(trace, "phase")
    assert tok_s >= 0.88 * reference(trace, "hindsight")


def test_confidence_without_signal_still_follows_an_abrupt_drift():
    """An overconfident drafter (the same confidence whether right or wrong) and acceptance that
    drops from 100 % to 0 % mid-reasoning: the estimates must forget fast enough to stay within
    5 % of the per-step oracle."""
    trace = drift_trace()
    assert confident(trace, ConfidenceModel(3.0, 3.0, 0.5)) >= 0.95 * reference(trace, "oracle")


def test_confidence_off_keeps_the_acceptance_policy():
    policy = make_policy(confidence=False)
    assert policy.calibrators is None
    assert policy.depth(R) == 1


def test_gate_verifies_confident_drafts_and_skips_doubtful_ones():
    policy = make_policy(prior_weight=1.0)
    calibrate(policy, R, [1.0, 0.0, 0.0])
    sure, doubtful = [6.0, 6.0], [-3.0, -3.0]
    assert policy.gate([(R, "a", sure, 2), (R, "b", doubtful, 2), (R, "c", sure, 1)]) == [2, 0, 1]
    assert policy.gate([(R, "a", sure, 2), (R, "b", doubtful, 2)], uniform="max") == [2, 2]


def test_parallel_drafter_drafts_every_position_once_confidences_flow():
    policy = make_policy(draft_token_cost_ratio=0.0)
    policy.gate([(R, "a", [0.0, 0.0], 2)])
    assert policy.depth(R, "a") == 2  # drafting is free: the gate decides what is verified
    sequential = make_policy(draft_token_cost_ratio=0.3)
    calibrate(sequential, R, [1.0, 0.0, 0.0])
    for _ in range(200):  # doubtful drafts: their gated gain is below what drafting one costs
        sequential.gate([(R, "a", [-2.0, -2.0], 2)])
    assert sequential.depth(R, "a") == 0


def test_learning_costs_never_go_deeper_than_the_phase_default():
    """The narrow testbed's failure: before the cost model tells depths apart, a high acceptance
    estimate must not pull a phase deeper than its default (a deeper depth may cost more)."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0)
    for _ in range(200):
        policy.observe(R, 2, 2, "a")
    assert policy.cost.learned() is None
    assert {policy.depth(R, "a") for _ in range(20)} == {1}
    given = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=False, explore=0.0, prior_weight=5.0)
    for _ in range(200):
        given.observe(R, 2, 2, "a")
    assert given.depth(R, "a") == 2  # given costs are trusted from the start


def test_learning_costs_never_go_shallower_than_the_phase_default_either():
    """The narrow testbed's first request: a prior cost that overprices a draft must not pull a
    phase to depth 0 (or stop a sequential drafter drafting) before measured costs say so."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0,
                            verify_cost_ratio=0.5, draft_token_cost_ratio=0.2)
    for _ in range(200):  # 40 % accepted: at the prior cost per draft depth 0 looks best
        policy.observe(R, 1, 1 if _ % 5 < 2 else 0, "a")
    assert policy.cost.learned() is None
    assert best_depth(policy.phase_rates(R), 0, 2, policy.cost.per_token)[0] == 0
    assert {policy.depth(R, "a") for _ in range(20)} == {1}
    calibrate(policy, R, [1.0, -3.0, -3.0])  # doubtful drafts: the gate verifies none
    assert policy.gate([(R, "a", [0.0, 0.0], 2)]) == [0]
    for _ in range(50):
        policy.gate([(R, "a", [0.0, 0.0], 2)])
    assert policy.depth(R, "a") == 1  # ... but the default's draft is still drafted
    given = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=False, explore=0.0, prior_weight=5.0,
                           verify_cost_ratio=0.5, draft_token_cost_ratio=0.2)
    for _ in range(200):
        given.observe(R, 1, 1 if _ % 5 < 2 else 0, "a")
    assert given.depth(R, "a") == 0  # given costs are acted on from the start


def test_learned_cost_needs_a_small_standard_error():
    rng = random.Random(5)
    model = StepCostModel(0.5, 0.04)
    for i in range(400):  # one request, verified alternating 0..2, noise 30 % of a step
        k = i % 3
        model.update(0.010 * (1 + 0.5 * k) + rng.gauss(0, 0.003), k, 1, k)
    assert model.learned() == pytest.approx(0.5, abs=0.15)
    noisy = StepCostModel(0.5, 0.04)
    for i in range(60):  # few steps, noise larger than the effect
        k = i % 2
        noisy.update(0.010 * (1 + 0.5 * k) + rng.gauss(0, 0.02), k, 1, k)
    assert noisy.learned() is None


def _learned_policy(noise: float, steps: int, a: float = 0.53) -> AdaptivePolicy:
    """Reasoning drafts accepted at ``a``; measured step times with a true per-token cost of 0.40
    of a depth-0 step (break-even for depth 1 vs 0 at 0.53: 0.53), with ``noise`` (fraction of a
    step, std) on every step."""
    rng = random.Random(11)
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0, confidence=False)
    for i in range(steps):
        k = (0, 1, 1, 2)[i % 4]
        policy.observe_step(0.005 * (1 + 0.4 * k) + rng.gauss(0, noise * 0.005), k, 1, k)
        policy.observe(R, 1, 1 if rng.random() < a else 0, None)
    return policy


def test_a_depth_other_than_the_default_must_win_across_the_learned_costs_band():
    """A flat optimum (the narrow testbed): depth 0 and 1 score within the learned cost's
    uncertainty, so the phase default stays; once the fit is tight and says so, the policy moves."""
    noisy = _learned_policy(noise=0.4, steps=400, a=0.40)
    low, high = noisy.cost.band()
    assert noisy.cost.learned() is not None and low < noisy.cost.learned() < high
    rates = noisy.phase_rates(R)
    assert best_depth(rates, 0, 2, noisy.cost.per_token)[0] == 0  # the point estimate prefers 0 ...
    assert [best_depth(rates, 0, 2, c)[0] for c in (low, high)] == [1, 0]  # ... within its uncertainty
    assert noisy.depth(R, "r") == 1  # so the default stays
    tight = _learned_policy(noise=0.05, steps=2000, a=0.30)  # depth 0 clearly better at a = 0.30
    low, high = tight.cost.band()
    assert high - low < 0.05
    assert tight.depth(R, "r") == 0


def test_a_request_record_shifts_its_gate_only_when_outcomes_persist():
    """Independent draft outcomes: a request's own record is noise and leaves its probabilities
    alone.  Outcomes in easy/hard stretches: a request that keeps failing is gated harder."""
    def run(persistent: bool) -> AdaptivePolicy:
        policy = make_policy(prior_weight=1.0)
        rng = random.Random(3)
        for step in range(400):
            for req in ("easy", "hard"):
                if persistent:  # each request keeps its own fate
                    accepted = 2 if req == "easy" else 0
                else:  # both requests draw from one coin: no request is special
                    accepted = 2 if rng.random() < 0.5 else 0
                policy.depth(R, req)
                policy.gate([(R, req, [1.0, 1.0], 2)])
                policy.observe(R, 2, accepted, req)
                policy.observe_confidence(R, [1.0, 1.0], 2, accepted, req)
        return policy

    independent = run(False)
    assert independent.persistence[R].rho() == 0.0
    independent.gate([(R, "hard", [1.0, 1.0], 2)])
    assert independent.offsets["hard"] is None
    persistent = run(True)
    assert persistent.persistence[R].rho() > 0.5
    persistent.gate([(R, "easy", [1.0, 1.0], 2), (R, "hard", [1.0, 1.0], 2)])
    easy, hard = persistent.offsets["easy"], persistent.offsets["hard"]
    assert all(e > 0.5 for e in easy) and hard[0] < -0.5  # its second draft was never reached



def test_before_costs_are_learned_a_default_draft_is_skipped_only_if_it_loses_at_half_the_prior():
    """The narrow testbed's first requests: a prior that overprices a draft (0.48 of a step
    against ~0.2 measured) gated away drafts accepted ~60 % of the time.  Until costs are learned
    the gate trusts the prior only within PRIOR_SPREAD: a draft that pays at half the prior cost
    is verified; one that does not is still skipped."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, verify_cost_ratio=0.5,
                            draft_token_cost_ratio=0.2)
    verify, _ = policy.cost.split()
    assert policy.cost.learned() is None and verify == pytest.approx((0.5 + 0.2) / 1.04 * (0.5 / 0.7), rel=1e-6)
    calibrate(policy, R, [1.0, 0.0, 0.0])
    middling = _logit_of(0.35)  # survival 0.35: below the prior's verify cost, above half of it
    doubtful = _logit_of(0.15)
    assert verify / 2 < 0.35 < verify and 0.15 < verify / 2
    assert policy.gate([(R, "a", [middling, middling], 2)]) == [1]  # the default's one draft
    assert policy.gate([(R, "a", [doubtful, doubtful], 2)]) == [0]
    given = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=False, explore=0.0, verify_cost_ratio=0.5,
                           draft_token_cost_ratio=0.2)
    calibrate(given, R, [1.0, 0.0, 0.0])
    assert given.gate([(R, "a", [middling, middling], 2)]) == [0]  # a given cost is acted on


def _logit_of(p: float) -> float:
    return math.log(p / (1.0 - p))


def test_one_doubtful_draft_does_not_stop_a_sequential_drafter():
    """A position's gated gain starts from the most the phase's rates allow: the first gated draft
    moves it, it does not replace it (one doubtful draft right after costs were learned used to
    stop the narrow testbed drafting for ~40 steps)."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=False, explore=0.0, prior_weight=5.0,
                            verify_cost_ratio=0.2, draft_token_cost_ratio=0.1)
    for _ in range(100):
        policy.observe(R, 1, 1 if _ % 10 < 7 else 0, "a")  # 70 % accepted: worth drafting
    calibrate(policy, R, [1.0, 0.0, 0.0])
    policy.gate([(R, "a", [-8.0, -8.0], 2)])  # one draft the calibrator calls hopeless
    assert policy.depth(R, "a") >= 1


def test_a_deeper_position_is_drafted_until_its_gated_gain_is_measured():
    """Rates of 0.5 per position and a verify cost of 0.36: the rates alone say a second draft is
    never worth verifying (0.25 < 0.36), yet gated on confidences it may be (sure drafts survive
    ~1).  It is drafted until gated drafts say what it gains, then kept or dropped on that."""
    def policy_after(features: list[float]) -> AdaptivePolicy:
        policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=False, explore=0.0, prior_weight=5.0,
                                verify_cost_ratio=0.36 * 1.04, draft_token_cost_ratio=0.1 * 1.04)
        for i in range(100):
            policy.observe(R, 2, (2, 0, 1, 0)[i % 4], "a")  # ~0.5 at each position
        calibrate(policy, R, [1.0, 0.0, 0.0])
        assert policy.cost.split() == (pytest.approx(0.36), pytest.approx(0.1))
        policy.confidence_seen = True  # confidences flow, none gated yet
        assert policy.depth(R, "a") == 2  # not yet measured: drafted
        for _ in range(300):
            policy.gate([(R, "a", features, 2)])
        return policy

    assert policy_after([6.0, 6.0]).depth(R, "a") == 2  # sure drafts: the second one pays
    assert policy_after([6.0, -6.0]).depth(R, "a") == 1  # a hopeless second draft: dropped


def test_gains_measured_at_a_passing_verify_cost_do_not_stop_drafting_after_it():
    """The narrow testbed's requests 1-3: right after costs were learned the verify cost read 0.77
    of a step for a while; sure drafts (survival 0.9) then gained only 0.13, under the drafting
    cost, so nothing was drafted, no gain was measured again, and the stale gain kept drafting
    off after the cost fell to 0.2.  The gain is corrected to the current verify cost."""
    policy = AdaptivePolicy(2, {R: 2, A: 2}, learn_cost=False, explore=0.0, prior_weight=5.0,
                            verify_cost_ratio=0.77, draft_cost_ratio=0.0, draft_token_cost_ratio=0.31)
    calibrate(policy, R, [1.0, 0.0, 0.0])
    sure = _logit_of(0.9 ** 0.5)  # survival 0.95 at the first position, 0.9 at the second
    for _ in range(300):
        policy.gate([(R, "a", [sure, sure], 2)])
    assert policy.cost.split() == (pytest.approx(0.77), pytest.approx(0.31))
    assert policy.depth(R, "a") == 0  # at this cost, drafting does not pay
    policy.cost.prior, policy.cost.prior_split = 0.37, 0.2 / 0.37  # the cost falls: 0.2 / 0.17
    policy.cost.invalidate()
    assert policy.depth(R, "a") == 2


def test_cost_model_skips_an_engines_first_steps():
    """A fresh engine's first steps are slow whatever the depth (here: 5x, at the default depth 1,
    before the gate's first depth-0 steps): fitted, they delay the fit and leave it overpricing a
    draft for hundreds of steps."""
    model = StepCostModel(0.5, 0.04)
    for _ in range(16):
        model.update(0.050, 1, 1, 1)
    rng = random.Random(2)
    learned = []
    for i in range(400):
        k = (0, 0, 0, 1, 2)[i % 5]  # true per-token cost: 0.3 of a depth-0 step
        model.update(0.010 * (1 + 0.3 * k) + rng.gauss(0, 0.0005), k, 1, k)
        if i % 100 == 99:
            learned.append(model.learned())
    assert learned == [pytest.approx(0.3, abs=0.02)] * 4


def test_cost_split_is_learned_only_where_each_part_is_pinned_down():
    """Verified and drafted tokens apart on a quarter of the steps.  With both parts clearly
    non-zero the split is learned; with a verify part near zero (within its noise) the learned
    total keeps the prior's split instead of swinging the gate to 'verifying is free'."""
    def fit(d_ms: float, c_ms: float, noise_ms: float) -> StepCostModel:
        model = StepCostModel(0.5, 0.04, 0.2)
        rng = random.Random(4)
        for i in range(600):
            drafted = (1, 2, 1, 2)[i % 4]
            verified = drafted - 1 if i % 4 == 3 else drafted
            model.update((10.0 + d_ms * verified + c_ms * drafted + rng.gauss(0, noise_ms)) / 1000, verified, 1, drafted)
        return model

    clear = fit(2.0, 1.5, 0.3)
    assert clear.split() == (pytest.approx(0.2, abs=0.02), pytest.approx(0.15, abs=0.02))
    vague = fit(0.1, 3.0, 2.0)
    total = vague.learned()
    assert total is not None
    assert vague.split() == (pytest.approx(total * 0.5 / 0.7), pytest.approx(total * 0.2 / 0.7))


def _draft_model_steps(model_or_policy, f_ms: float, zero_share: float, steps: int = 800) -> None:
    """The testbed's draft_model steps: 12.7 ms at depth 0, +1.8 ms per drafted position, +4.8 ms
    per verified draft and ``f_ms`` once when any draft is verified; ``zero_share`` of the steps
    verify nothing."""
    rng = random.Random(5)
    update = getattr(model_or_policy, "observe_step", None) or model_or_policy.update
    for _ in range(steps):
        drafted = rng.choice([1, 2])
        verified = 0 if rng.random() < zero_share else rng.choice([1, drafted])
        seconds = (12.7 + 1.8 * drafted + 4.8 * verified + (f_ms if verified else 0.0) + rng.gauss(0, 0.5)) / 1000
        update(seconds, verified, 1, drafted)


def test_cost_model_learns_what_a_step_pays_once_for_verifying_any_draft():
    stepped = StepCostModel(0.5, 0.04, 0.2)
    _draft_model_steps(stepped, f_ms=2.2, zero_share=0.3)
    assert stepped.fixed == pytest.approx(2.2 / 12.7, abs=0.03)
    assert stepped.split() == (pytest.approx(4.8 / 12.7, abs=0.02), pytest.approx(1.8 / 12.7, abs=0.02))
    linear = StepCostModel(0.5, 0.04, 0.2)  # no step term in the data: none in the model
    _draft_model_steps(linear, f_ms=0.0, zero_share=0.3)
    assert linear.fixed == 0.0 and linear.split()[0] == pytest.approx(4.8 / 12.7, abs=0.02)
    always = StepCostModel(0.5, 0.04, 0.2)  # every step verifies: f and t0 cannot be told apart
    _draft_model_steps(always, f_ms=2.2, zero_share=0.0)
    assert always.fixed == 0.0 and always.learned() is not None


def test_a_sequential_drafter_stops_drafting_where_the_first_verified_draft_does_not_pay():
    """draft_model on the testbed: a lone draft that survives 0.6 gains 0.6 - 0.38 = 0.22 of a
    step at the linear verify cost, more than the 0.14 drafting it costs; with the 0.17 the step
    pays for verifying at all it gains 0.05 and is not worth drafting.  Sure drafts still are."""
    def policy_after(f_ms: float, survival: float) -> AdaptivePolicy:
        policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0)
        _draft_model_steps(policy, f_ms, zero_share=0.3)
        calibrate(policy, R, [1.0, 0.0, 0.0])
        for _ in range(300):
            policy.gate([(R, "a", [_logit_of(survival), -8.0], 2)])
        return policy

    linear = policy_after(0.0, 0.6)
    assert linear.depth(R, "a") == 1
    stepped = policy_after(2.2, 0.6)
    assert stepped.cost.fixed > 0.1 and stepped.depth(R, "a") == 0
    middling = [_logit_of(0.5), -8.0]  # verified alone it returns 1.5 tokens for 1.38 or 1.55
    assert linear.gate([(R, "a", middling, 2)]) == [1] and stepped.gate([(R, "a", middling, 2)]) == [0]
    assert policy_after(2.2, 0.95).depth(R, "a") == 1



def test_cost_model_statistics_are_the_forgetting_sums_of_every_fitted_step():
    """The per-shape sums, renormalised at every solve and rid of shapes whose weight faded,
    give the forgetting sums of x x^T, x * seconds and seconds^2 over the fitted steps, however
    the solves fall between them (step times exactly linear: nothing is clipped)."""
    model = StepCostModel(0.5, 0.04, 0.2, forget=0.99)
    model.NEGLIGIBLE = 1e-4  # a shape unseen for ~900 steps drops out
    rng = random.Random(5)
    fitted = []
    for i in range(2000):
        requests = rng.choice((1, 2, 3)) if i < 600 else 1  # the multi-request shapes fade out
        depth = rng.choice((0, 1, 2))
        verified = requests * rng.randint(0, depth)
        seconds = (0.010 + 0.002 * requests + 0.004 * verified + 0.002 * depth + (0.003 if verified else 0.0)
                   + (0.001 if depth else 0.0))
        model.update(seconds, verified, requests, depth)
        if i >= model.WARMUP:
            fitted.append((float(requests), float(verified), float(depth), seconds))
    xx, xy, yy = [[0.0] * 6 for _ in range(6)], [0.0] * 6, 0.0
    for age, (r, v, d, y) in enumerate(reversed(fitted)):
        lam = 0.99 ** age
        x = (1.0, r, v, d, 1.0 if v else 0.0, 1.0 if d else 0.0)
        for i in range(6):
            for j in range(6):
                xx[i][j] += lam * x[i] * x[j]
            xy[i] += lam * x[i] * y
        yy += lam * y * y
    assert set(model.shapes) == {(1.0, float(v), float(d)) for d in range(3) for v in range(d + 1)}
    faded = 0.99 ** (2000 - 600)  # times 100 (1 / (1 - forget)): the most weight a dropped shape had left
    got_xx, got_xy, got_yy = model._statistics()
    tol = dict(rel=1e-9, abs=1000 * faded)
    assert [got_xy, got_yy] == [pytest.approx(xy, **tol), pytest.approx(yy, **tol)]
    for got_row, row in zip(got_xx, xx):
        assert got_row == pytest.approx(row, **tol)
    t = model.both_steps.coef  # lately one request per step: only t0 + t1 is told apart
    assert [t[0] + t[1]] + t[2:] == pytest.approx([0.012, 0.004, 0.002, 0.003, 0.001], abs=1e-6)


def test_the_offset_context_of_a_phase_is_refreshed_every_few_observations():
    """A request's offsets are measured against its phase's rates; those move by ~1/window per
    observation, so the context is reused for ``CONTEXT_REFRESH`` observations, then rebuilt."""
    policy = make_policy(prior_weight=1.0)
    for step in range(200):  # streaky outcomes: persistence, so the context is not empty
        for req in ("easy", "hard"):
            policy.observe(R, 2, 2 if req == "easy" else 0, req)
    first = policy._context(R)
    assert first and first[0] == policy.phase_rates(R)
    for _ in range(policy.CONTEXT_REFRESH - 1):
        policy.observe(R, 2, 2, "easy")
        assert policy._context(R) is first  # reused: no recomputation per request-step
    assert policy.phase_rates(R) != first[0]  # meanwhile the rates moved
    policy.observe(R, 2, 2, "easy")
    refreshed = policy._context(R)
    assert refreshed is not first and refreshed[0] == policy.phase_rates(R)


def test_drafting_probes_one_position_more_and_one_fewer():
    """With confidences flowing, the drafting depth is probed both ways: one more keeps gains
    measured, one fewer keeps a step that drafts less in the cost fit (with the idle drafter
    skipped, a step that drafts nothing is the only one that shows what drafting costs)."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.1, prior_weight=5.0,
                            draft_token_cost_ratio=0.2)
    policy.confidence_seen = True  # costs not learned yet: the phase default, 1, is drafted
    ks = [policy.depth(R, "a") for _ in range(5000)]
    assert ks.count(2) / len(ks) == pytest.approx(0.1, abs=0.02)
    assert ks.count(0) / len(ks) == pytest.approx(0.1, abs=0.02)
    floor = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.1, prior_weight=5.0, min_depth=1,
                           draft_token_cost_ratio=0.2)
    floor.confidence_seen = True
    assert min(floor.depth(R, "a") for _ in range(500)) == 1  # never below min_depth
    parallel = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.1, prior_weight=5.0)
    parallel.confidence_seen = True  # a parallel drafter's positions cost nothing apart: never fewer
    assert min(parallel.depth(R, "a") for _ in range(500)) == 1


def test_a_phase_drafts_its_default_positions_until_their_gated_gain_is_measured():
    """draft_model on the testbed, first request: costs learned while reasoning, the answer not
    yet seen.  Its prior rates alone said drafting does not pay, so nothing was drafted, nothing
    gated, and the answer ran at depth 0 for the whole request.  A never-gated position within
    the phase default is drafted until gated drafts say what it gains."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=False, explore=0.0, prior_weight=5.0,
                            verify_cost_ratio=0.5, draft_token_cost_ratio=0.5)
    calibrate(policy, A, [1.0, 0.0, 0.0])
    policy.confidence_seen = True
    assert policy._rate_survival(A, 0) * (1.0 - policy.cost.split()[0]) < policy.cost.split()[1]
    assert policy.depth(A, "a") == 2 and policy.depth(R, "a") == 1  # the defaults
    for _ in range(200):
        policy.gate([(A, "a", [-4.0, -4.0], 2)])  # doubtful drafts: measured, then dropped
    assert policy.depth(A, "a") == 0


def _fit_steps(policy, shapes, repeat):
    """Feed decode steps of the given (verified, drafted, seconds) shapes, interleaved."""
    for _ in range(repeat):
        for verified, drafted, seconds in shapes:
            policy.observe_step(seconds, verified, 1, drafted)


def test_a_default_position_is_drafted_until_the_learned_costs_have_seen_a_step_verify_that_deep():
    """draft_model on the testbed (dm6): costs learned from steps at depths 0-1 only, where the
    first verified draft also pays the switch to the verification path, priced every draft like
    the first; the answer's gated gains then said stop, and depth 2 was never measured.  Within
    the phase default a position is drafted until a step that verifies that many drafts is fitted;
    then the gains decide."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0,
                            draft_token_cost_ratio=0.2)
    calibrate(policy, A, [1.0, 0.0, 0.0])
    # 12.7 ms idle, 19.8 ms verifying 1, 25.5 ms verifying 1 and drafting 1 (the testbed's medians)
    _fit_steps(policy, [(0, 0, 0.0127), (1, 0, 0.0198), (1, 1, 0.0255), (0, 0, 0.0127)], 40)
    costs = policy.cost.view()
    assert costs.learned is not None and policy.cost.depths == {0, 1}
    assert costs.draft + costs.drafter_share > 0.3  # drafting priced at a third of a step and more
    for _ in range(300):
        policy.gate([(A, "a", [-1.0, -1.0], 2)])  # gated gains below the drafting cost
    assert policy.depth(A, "a") == 2  # depth 2 unmeasured: the default is drafted
    assert policy.depth(R, "a") < 2
    _fit_steps(policy, [(2, 2, 0.040), (0, 0, 0.0127), (1, 1, 0.0255)], 60)  # deeper steps: costly
    assert 2 in policy.cost.depths
    assert policy.depth(A, "a") < 2  # measured: the gains decide


def test_a_drafter_that_catches_up_after_idle_steps_keeps_those_steps_out_of_the_cost_fit():
    """With the idle drafter skipped, the first drafting step after one that drafted nothing also
    runs the drafter over the positions it missed: counted, not fitted."""
    shapes = [(0, 0, 0.0125), (0, 0, 0.0125), (0, 1, 0.040), (1, 1, 0.020), (1, 0, 0.019)]
    catching = AdaptivePolicy(2, {R: 1, A: 2}, draft_token_cost_ratio=0.2, drafter_catches_up=True)
    plain = AdaptivePolicy(2, {R: 1, A: 2}, draft_token_cost_ratio=0.2)
    for policy in (catching, plain):
        _fit_steps(policy, shapes, 60)
    assert catching.cost.caught_up == 60 and plain.cost.caught_up == 0
    assert (0.0, 1.0) not in {(v, d) for _r, v, d in catching.cost.shapes}
    assert (0.0, 1.0) in {(v, d) for _r, v, d in plain.cost.shapes}
    assert catching.cost.view().draft < plain.cost.view().draft


def test_without_confidences_a_phase_keeps_its_default_until_the_costs_have_seen_it():
    """The phase path (no confidences) of the same trap: costs fitted over depths 0-1 price the
    answer's second draft like its first, and depth 0 scores best; the default stays until a
    step that verifies as deep is fitted."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0,
                            draft_token_cost_ratio=0.2, confidence=False)
    _fit_steps(policy, [(0, 0, 0.0127), (1, 0, 0.0198), (1, 1, 0.0255), (0, 0, 0.0127)], 40)
    for _ in range(50):
        policy.observe(A, 2, 2, "a")
        policy.observe(A, 2, 1, "a")  # 3 of 4 drafts accepted
    costs = policy.cost.view()
    assert costs.learned is not None and policy.cost.depths == {0, 1}
    assert best_depth(policy.phase_rates(A), 0, 2, costs.per_token, costs.fixed_share)[0] < 2
    assert policy.depth(A, "a") == 2  # depth 2 unmeasured: the default stands
    _fit_steps(policy, [(2, 2, 0.040), (0, 0, 0.0127), (1, 1, 0.0255)], 60)  # deeper steps: costly
    assert 2 in policy.cost.depths
    assert policy.depth(A, "b") < 2  # measured: the costs decide


def _skipped_drafter_steps(policy_or_model, idle_share: float, steps: int = 900, seed: int = 6) -> None:
    """The testbed's draft_model steps with the idle drafter skipped (dm8 medians): 10.2 ms
    drafting nothing, +4.5 ms once for running the drafter, +0.3 ms per drafted position, +3 ms
    once for verifying any draft and +4.2 ms per verified draft; ``idle_share`` of the steps draft
    nothing (a catch-up step is not generated: the model would leave it out)."""
    rng = random.Random(seed)
    update = getattr(policy_or_model, "observe_step", None) or policy_or_model.update
    for _ in range(steps):
        drafted = 0 if rng.random() < idle_share else rng.choice([1, 2, 2])
        verified = rng.choice([0, 1, 2, 2])
        seconds = (10.2 + (4.5 + 0.3 * drafted if drafted else 0.0) + (3.0 + 4.2 * verified if verified else 0.0)
                   + rng.gauss(0, 0.5)) / 1000
        update(seconds, verified, 1, drafted)


def test_cost_model_learns_what_a_step_pays_once_for_running_the_drafter():
    """Where the idle drafter is skipped, its first pass and input preparation are paid once per
    drafting step: a per-position cost alone puts that in the intercept (a depth-0 step priced at
    a drafting step's 15 ms) and prices drafting at next to nothing.  Steps that draft nothing pin
    the step term down; with none it cannot be told from the intercept and is not used."""
    model = StepCostModel(0.5, 0.04, 0.2)
    _skipped_drafter_steps(model, idle_share=0.3)
    view = model.view()
    assert view.drafter == pytest.approx(4.5 / 10.2, abs=0.04)
    assert view.fixed == pytest.approx(3.0 / 10.2, abs=0.04)
    assert view.verify == pytest.approx(4.2 / 10.2, abs=0.03) and view.draft < 0.08
    assert "drafter run +0.4" in model.describe()
    never_idle = StepCostModel(0.5, 0.04, 0.2)
    _skipped_drafter_steps(never_idle, idle_share=0.0)
    assert never_idle.learned() is not None and never_idle.drafter == 0.0


def test_drafting_pays_the_drafter_once_for_the_whole_prefix():
    """Drafted positions are chosen as the prefix with the largest summed gain less its costs: the
    first draft alone may not pay for running the drafter (and the first verification) while the
    first two do.  A stop at the first unprofitable position drafted nothing in the answer here."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0,
                            draft_token_cost_ratio=0.2)
    _skipped_drafter_steps(policy, idle_share=0.3)
    costs = policy.cost.view()
    assert costs.drafter > 0.35 and 2 in policy.cost.depths
    for phase, p in ((A, 0.95), (R, 0.8)):
        calibrate(policy, phase, [1.0, 0.0, 0.0])
        for _ in range(300):
            policy.gate([(phase, "a", [_logit_of(p), _logit_of(p)], 2)])

    def gains(phase: Phase) -> list[float]:
        return [policy.gains[phase][j].at(v) for j, v in enumerate((costs.verify + costs.fixed, costs.verify))]

    first, second = gains(A)
    assert first - costs.draft < costs.drafter < first + second - 2 * costs.draft
    assert policy.depth(A, "a") == 2
    # reasoning: each position gains more than its forward costs, not enough to run the drafter
    first, second = gains(R)
    assert min(first, second) > costs.draft and first + second - 2 * costs.draft < costs.drafter
    assert policy.depth(R, "a") == 0


def test_a_skipped_drafter_probes_drafting_nothing_until_such_steps_are_fitted():
    """Where the idle drafter is skipped, a request-step drafts nothing ``IDLE_PROBE`` of the time
    until ``MIN_IDLE_FITTED`` steps that drafted nothing are fitted; then only the usual probes."""
    def zero_share(policy: AdaptivePolicy) -> float:
        ks = [policy.depth(A, "a") for _ in range(4000)]
        return ks.count(0) / len(ks)

    catching = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.02, draft_token_cost_ratio=0.2, drafter_catches_up=True)
    catching.confidence_seen = True
    probing = zero_share(catching)
    assert probing == pytest.approx(AdaptivePolicy.IDLE_PROBE, abs=0.02)
    plain = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.02, draft_token_cost_ratio=0.2)
    plain.confidence_seen = True
    assert zero_share(plain) == 0.0  # at depth 2 a probe one fewer is depth 1
    assert probing > 0.05
    _skipped_drafter_steps(catching, idle_share=0.3, steps=200)
    assert catching.cost.idle_fitted >= AdaptivePolicy.MIN_IDLE_FITTED
    assert zero_share(catching) < 0.01


def test_a_phase_seen_for_the_first_time_verifies_its_default_until_its_calibrator_has_labels():
    """dm2: the first answer came after costs were learned (a first verified draft ~0.8 of a
    step); gated on its fresh calibrator's prior guess its drafts paid nothing, none was verified,
    no label came, and the answer drafted nothing for four requests.  Until ``MIN_LABELS`` labels,
    a phase verifies and drafts what its default says; then its calibrated confidences gate."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, learn_cost=True, explore=0.0, prior_weight=5.0,
                            draft_token_cost_ratio=0.2)
    _skipped_drafter_steps(policy, idle_share=0.3)
    assert policy.cost.view().learned is not None and policy.confidence_seen is False
    middling = [1.0, 1.0]  # the prior's guess: sigmoid(0.5) = 0.62, then 0.38
    trusting = copy.deepcopy(policy)
    trusting.MIN_LABELS = 0
    assert trusting.gate([(A, "a", middling, 2)]) == [0]  # gated on the guess: nothing verified
    assert trusting.depth(A, "a") < 2
    assert policy.gate([(A, "a", middling, 2)]) == [2] and policy.depth(A, "a") == 2  # the default
    assert policy.gate([(A, "a", middling, 2), (A, "b", middling, 2)], uniform="min") == [2, 2]
    labels = 0
    while labels < AdaptivePolicy.MIN_LABELS:
        assert policy.gate([(A, "a", middling, 2)]) == [2]
        assert policy.depth(A, "a") == 2
        policy.observe_confidence(A, middling, 2, 2, "a")  # both accepted: two labels
        labels += 2
    assert policy.calibrators[A].report.labels == labels
    doubtful = [-6.0, -6.0]
    assert policy.gate([(A, "a", doubtful, 2)]) == [0]  # calibrated now: the gate decides


def test_without_confidences_the_prior_alone_does_not_take_a_phase_off_its_default():
    """dm2/dm3: the answer (95 % of drafts accepted) left its default after ``prior_weight``
    observations, when the prior's pull toward 1/2 still read its rates as ~0.72: depth 0 scored
    best, and an answer that drafts nothing gets no observations to correct it.  A depth below
    the default is taken only if the phase's rates from the data alone agree; a phase whose drafts
    do fail (reasoning, 55 %) still leaves."""
    policy = AdaptivePolicy(2, {R: 2, A: 2}, learn_cost=True, explore=0.0, confidence=False,
                            draft_token_cost_ratio=0.2, hysteresis=0.0)
    _skipped_drafter_steps(policy, idle_share=0.3)
    costs = policy.cost.view()
    assert costs.learned is not None and 2 in policy.cost.depths
    rng = random.Random(8)
    feed(policy, 0.95, int(policy.prior_weight), 2, rng, phase=A, req="a")
    feed(policy, 0.55, int(policy.prior_weight), 2, rng, phase=R, req="r")
    shrunk, data = policy.phase_rates(A), policy.data_rates(A)
    assert shrunk[0] < 0.75 < 0.85 < data[0]
    assert best_depth(shrunk, 0, 2, costs.per_token, costs.step_share)[0] == 0  # the prior's verdict
    assert best_depth(data, 0, 2, costs.per_token, costs.step_share)[0] == 2
    assert policy.depth(A, "a") == 2
    assert policy.depth(R, "r") < 2


def _settled(policy: AdaptivePolicy, phase: Phase, gains: list[float]) -> None:
    """Give a phase's positions these measured gated gains (at the current verify cost, so that
    ``at`` returns them as they are) and a calibrator that has its labels."""
    verify = policy.cost.view().verify
    policy.gains[phase] = [GatedGain(g, 0.0, verify) for g in gains]
    calibrate(policy, phase, [1.0, 0.0, 0.0])
    policy.confidence_seen = True


def test_a_sequential_drafter_whose_learned_position_cost_is_nil_is_not_taken_for_a_parallel_one():
    """dm6: the fit put a drafted position at 0 (and could not pin the drafter's step term), and
    a sequential drafter was then treated as a parallel one: every request-step drafted every
    position, no step drafted fewer, and nothing could show the fit what drafting costs.  A
    drafter given a per-position cost keeps choosing its prefix by gains, and keeps probing one
    fewer."""
    def steps(policy: AdaptivePolicy) -> None:
        rng = random.Random(3)
        for _ in range(900):
            drafted = 0 if rng.random() < 0.3 else rng.choice([1, 2, 2])
            verified = rng.choice([0, 1, 2, 2])
            seconds = 10.2 - 0.1 * drafted + (3.0 + 4.2 * verified if verified else 0.0) + rng.gauss(0, 0.3)
            policy.observe_step(seconds / 1000, verified, 1, drafted)

    sequential = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.0, draft_token_cost_ratio=0.2)
    steps(sequential)
    costs = sequential.cost.view()
    assert costs.learned is not None and costs.draft == 0.0 and costs.drafter == 0.0
    _settled(sequential, R, [0.0, 0.0])  # hopeless drafts: nothing to gain from drafting them
    assert sequential.depth(R, "a") == 0
    parallel = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.0, draft_token_cost_ratio=0.0)
    steps(parallel)
    _settled(parallel, R, [0.0, 0.0])
    assert parallel.depth(R, "a") == 2  # one pass drafts every position: the gate decides
    _settled(sequential, A, [0.5, 0.4])
    sequential.explore = 0.05
    ks = [sequential.depth(A, "a") for _ in range(4000)]
    assert ks.count(1) / len(ks) == pytest.approx(0.05, abs=0.015)  # probes one fewer


def test_positions_beyond_the_forced_prefix_must_pay_at_the_upper_ends_of_the_learned_costs():
    """Reasoning's drafts on the testbed are near break-even, and the fit's per-position cost
    swings by a standard error from solve to solve: a sequential drafter's prefix is drafted only
    if its gains beat what drafting costs at the upper ends (``draft_high``,
    ``drafter_share_high``); a parallel drafter's at the central costs."""
    for draft_token_cost, at_midpoint in ((0.2, 0), (0.0, 1)):  # sequential, then parallel
        policy = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.0, draft_token_cost_ratio=draft_token_cost)
        _skipped_drafter_steps(policy, idle_share=0.3)
        costs = policy.cost.view()
        assert costs.draft_high > costs.draft and costs.drafter_share_high > costs.drafter_share > 0
        central = costs.draft + costs.drafter_share
        high = costs.draft_high + costs.drafter_share_high
        _settled(policy, R, [(central + high) / 2, 0.0])  # pays at the central costs, not at the upper ends
        assert policy.depth(R, "a") == at_midpoint
        _settled(policy, R, [high + 0.01, 0.0])
        assert policy.depth(R, "a") == 1


def test_idle_probes_resume_where_drafting_is_marginal_once_the_fitted_idle_steps_are_old():
    """The machine's speed drifts: a depth-0 step measured only early (dm6: while the machine was
    slow) prices every later drafting step against a stale baseline.  Once the fitted idle steps
    weigh less than ``MIN_IDLE_RECENT``, a phase whose drafting nets less than ``MARGINAL`` of a
    step probes drafting nothing again; one that gains more from drafting does not pay for it."""
    def zero_share(policy: AdaptivePolicy, phase: Phase) -> float:
        ks = [policy.depth(phase, "a") for _ in range(4000)]
        return ks.count(0) / len(ks)

    def settle(policy: AdaptivePolicy) -> None:  # at the costs learned so far
        costs = policy.cost.view()
        entry = costs.draft_high + costs.drafter_share_high  # one position, priced as it must pay
        _settled(policy, R, [entry + 0.1, 0.0])  # drafting nets a tenth of a step
        _settled(policy, A, [entry + 0.5, costs.draft_high + 0.4])  # ... nearly a step

    policy = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.02, draft_token_cost_ratio=0.2, drafter_catches_up=True)
    _skipped_drafter_steps(policy, idle_share=0.3, steps=300)
    assert policy.cost.idle_fitted >= AdaptivePolicy.MIN_IDLE_FITTED
    settle(policy)
    assert policy.cost.idle_recent >= AdaptivePolicy.MIN_IDLE_RECENT
    assert zero_share(policy, R) == pytest.approx(policy.explore, abs=0.01)  # the probes one fewer
    _skipped_drafter_steps(policy, idle_share=0.0, steps=1500, seed=7)
    assert policy.cost.idle_recent < AdaptivePolicy.MIN_IDLE_RECENT
    settle(policy)
    assert zero_share(policy, R) == pytest.approx(policy.explore + AdaptivePolicy.IDLE_PROBE, abs=0.02)
    assert zero_share(policy, A) < 0.01
    _skipped_drafter_steps(policy, idle_share=1.0, steps=20, seed=8)  # the probes' steps
    assert policy.cost.idle_recent >= AdaptivePolicy.MIN_IDLE_RECENT
    settle(policy)
    assert zero_share(policy, R) == pytest.approx(policy.explore, abs=0.01)  # the probes one fewer


def test_a_drafter_that_catches_up_probes_from_depth_0_at_a_quarter_of_the_rate():
    """A probe from depth 0 also pays the drafter's catch-up where the idle drafter is skipped
    (on the testbed ~0.8 of a step per probe of reasoning's drafts): there a phase that drafts
    nothing probes at ``IDLE_EXPLORE`` of ``explore``; elsewhere, and at other depths, at ``explore``."""
    def probe_share(policy: AdaptivePolicy, phase: Phase, depth: int) -> float:
        ks = [policy.depth(phase, "a") for _ in range(8000)]
        return ks.count(depth + 1) / len(ks)

    for catches_up, rate in ((True, 0.04 * AdaptivePolicy.IDLE_EXPLORE), (False, 0.04)):
        policy = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.04, draft_token_cost_ratio=0.2,
                                drafter_catches_up=catches_up)
        _skipped_drafter_steps(policy, idle_share=0.3)
        _settled(policy, R, [0.0, 0.0])  # nothing to gain: depth 0
        assert probe_share(policy, R, 0) == pytest.approx(rate, abs=0.005)
        costs = policy.cost.view()
        _settled(policy, R, [costs.draft_high + costs.drafter_share_high + 0.5, 0.0])  # depth 1
        assert probe_share(policy, R, 1) == pytest.approx(0.04, abs=0.008)
        no_confidence = AdaptivePolicy(2, {R: 0, A: 2}, explore=0.04, confidence=False,
                                       drafter_catches_up=catches_up)
        assert probe_share(no_confidence, R, 0) == pytest.approx(rate, abs=0.005)


def test_a_positions_first_gain_counts_the_higher_of_the_shrunk_and_the_data_only_rates():
    """Before its first gated draft a position's gain is the most the phase's rates allow, read
    optimistically: the prior's pull toward 1/2 (``prior_weight`` pseudo-observations) would read
    a 95 %-accepted answer as barely worth drafting, and a position not drafted is never measured."""
    policy = AdaptivePolicy(2, {R: 1, A: 2}, explore=0.0, prior_weight=200.0, draft_token_cost_ratio=0.2)
    _skipped_drafter_steps(policy, idle_share=0.3)
    feed(policy, 0.95, 30, 2, random.Random(4), phase=A, req="a")
    shrunk, data = policy.phase_rates(A), policy.data_rates(A)
    assert shrunk[0] < 0.65 < 0.85 < data[0]
    calibrate(policy, A, [1.0, 0.0, 0.0])
    costs = policy.cost.view()
    first = costs.verify + costs.fixed  # one request: the first draft pays the step term too
    sure = _logit_of(0.999)
    policy.gate([(A, "a", [sure, sure], 2)])
    started = policy.gains[A][0]
    # one gated draft moved it by GAIN_RATE from where it started: undo that move
    rate = AdaptivePolicy.GAIN_RATE
    start = (started.gain - rate * (0.999 - first)) / (1.0 - rate)
    assert start == pytest.approx(data[0] * (1.0 - first), abs=0.02)
    assert start > shrunk[0] * (1.0 - first) + 0.1
