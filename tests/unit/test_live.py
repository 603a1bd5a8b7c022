"""The live estimate under the phase policy and the peers' rules (``core/live.py``; pure logic)."""

import random

import pytest

from dspark_dynamic.adapter.build import build_policy
from dspark_dynamic.core.adaptive import AdaptivePolicy
from dspark_dynamic.core.controller import DepthController, StepTiming
from dspark_dynamic.core.live import Estimated
from dspark_dynamic.core.options import parse_options
from dspark_dynamic.core.peers import PEERS
from dspark_dynamic.core.phase import Phase, PhaseRules
from dspark_dynamic.core.policy import PhasePolicy
from dspark_dynamic.core.request_policy import RequestPolicy
from dspark_lab.fakes import FakeRequest

S, E = 5, 6
RULES = PhaseRules.of([S], [E])
N = 2
ACCEPT = 0.9  # per position, given the drafts before it accepted


def machine_ms(verified: int, drafted: int) -> float:
    """A one-request step: 10 ms, 2 ms per verified draft, 1 ms when the drafter runs."""
    return 10.0 + 2.0 * verified + (1.0 if drafted else 0.0)


def step(ctl, req, drafts, rng, timing=True):
    """One decode step of ``req`` alone with ``drafts`` drafts offered; returns the next step's
    drafts (what the drafter is asked for), the depth verified and the tokens added."""
    req.spec_token_ids = [0] * drafts
    decisions = ctl.before_schedule([req])
    bound = ctl.plan_drafts([req])
    k = decisions[req.request_id][1]
    accepted = 0
    while accepted < k and rng.random() < ACCEPT:
        accepted += 1
    tokens = accepted + 1
    req.output_token_ids = req.output_token_ids + [9] * tokens
    counted = {req.request_id: (k, accepted)} if k > 0 else {}
    ctl.after_output(decisions, counted, {req.request_id: tokens},
                     StepTiming(machine_ms(k, bound) / 1e3, True, 1, bound) if timing else None)
    return bound, k, tokens


def run_arms(ctl, arms, rounds, steps=40, seed=0):
    """Each round, one request per arm copy, for ``steps`` decode steps each (answer phase), the
    requests taking turns one decode step at a time (a step carries one request); returns per arm
    label the (tokens, seconds) it ran."""
    rng = random.Random(seed)
    ran = {}
    serial = 0
    for _r in range(rounds):
        live = []
        for label, copies in arms:
            for _c in range(copies):
                serial += 1
                live.append([label, FakeRequest(f"{label}#{serial}", [1, E]), N])
        for _ in range(steps):
            for row in live:
                label, req, drafts = row
                row[2], k, tokens = step(ctl, req, drafts, rng)
                t, s = ran.get(label, (0, 0.0))
                ran[label] = (t + tokens, s + machine_ms(k, row[2]) / 1e3)
        for _label, req, _d in live:
            ctl.forget(req.request_id)
    return ran


def own_policy(req):
    """Requests named ``fixed K#...`` ask for their own fixed depth K; the others follow the server's."""
    label = req.request_id.split("#")[0]
    if label.startswith("fixed "):
        k = int(label.split()[1])
        return RequestPolicy(label, (k, k))
    return None


def test_the_estimate_of_a_phase_policy_matches_the_analytic_speed_ups():
    """The server's phase policy verifies 1 draft of N = 2 at 0.9 (13 ms for 1.9 tokens); plain is
    10 ms for a token, the fixed depth 15 ms for 1 + 0.9 + 0.81 = 2.71 tokens.  Requests with
    their own depth 0 and 2 supply those steps (three fixed-2 requests per round, so the mix of
    every arm would read ~0.90 of fixed, not 0.81): the estimate counts the server's requests
    alone, at 1.9/13 over 1/10 and over 2.71/15, and agrees with the measured ratio."""
    policy = Estimated(PhasePolicy(1, 1), N, prior_weight=5.0)
    ctl = DepthController(RULES, policy, request_policy=own_policy)
    assert policy.estimate() is None  # nothing before the costs are learned
    ran = run_arms(ctl, [("fixed 0", 1), ("fixed 2", 3), ("server", 1)], rounds=40)
    est = policy.estimate()
    assert set(est) == {"answer", "all"}
    speed = {label: t / s for label, (t, s) in ran.items()}
    assert speed["server"] / speed["fixed 0"] == pytest.approx(1.9 / 13 * 10, rel=0.04)  # measured
    assert speed["server"] / speed["fixed 2"] == pytest.approx(1.9 / 13 / (2.71 / 15), rel=0.04)
    assert est["all"]["plain"] == pytest.approx(1.9 / 13 * 10, rel=0.04)
    assert est["all"]["fixed"] == pytest.approx(1.9 / 13 / (2.71 / 15), rel=0.04)
    assert est["all"]["fixed"] == pytest.approx(speed["server"] / speed["fixed 2"], rel=0.04)
    mix = sum(t for t, _s in ran.values()) / sum(s for _t, s in ran.values()) / speed["fixed 2"]
    assert abs(est["all"]["fixed"] - mix) > 0.06  # not the mix of every arm
    assert "estimated speed-up 1.4" in policy.describe(Phase.ANSWER) and "depth=1" in policy.describe(Phase.ANSWER)


def learned(policy, seed=1):
    """``policy`` after 400 decode steps of one or two requests at depths 0-2 (``machine_ms``, 1 ms
    per request more): its step cost solved."""
    rng = random.Random(seed)
    for _ in range(400):
        r, d = rng.choice((1, 2)), rng.choice((0, 1, 2))
        policy.observe_step((machine_ms(r * d, d) + r - 1) / 1e3, r * d, r, d)
    assert policy.cost.known
    return policy


def test_a_request_the_policy_did_not_decide_for_is_left_out_at_its_share():
    """A request with its own policy shares a step with the server's: the server's counts at half
    the step's time, the alternatives priced at two requests (as if both were the server's)."""
    policy, both = learned(Estimated(PhasePolicy(1, 1), N)), learned(Estimated(PhasePolicy(1, 1), N))
    policy.depth(Phase.ANSWER, "mine")
    both.depth(Phase.ANSWER, "mine")
    both.depth(Phase.ANSWER, "theirs")
    for _ in range(200):
        policy.account_step(0.020, {"mine": (Phase.ANSWER, 1), "theirs": (Phase.ANSWER, 0)}, {"mine": 2, "theirs": 1})
        both.account_step(0.020, {"mine": (Phase.ANSWER, 1), "theirs": (Phase.ANSWER, 1)}, {"mine": 2, "theirs": 2})
    assert policy.estimate()["all"] == pytest.approx(both.estimate()["all"])
    policy.forget("mine")
    assert "mine" not in policy.decided
    for _ in range(200):  # no request of its own: nothing more is counted
        policy.account_step(0.010, {"theirs": (Phase.ANSWER, 0)}, {"theirs": 1})
    assert policy.estimate()["all"] == pytest.approx(both.estimate()["all"])


def drive(policy, steps=400, seed=3):
    """Two requests (one reasoning, one answering), draft confidences every step; the depths the
    controller verified and the drafts it asked for, step by step."""
    ctl = DepthController(RULES, policy)
    rng = random.Random(seed)
    reqs = [FakeRequest("r", [1, S]), FakeRequest("a", [1, E])]
    drafts = N
    seen = []
    for _ in range(steps):
        for req in reqs:
            req.spec_token_ids = [0] * drafts
            ctl.set_confidences(req.request_id, [rng.gauss(1.0, 2.0) for _ in range(drafts)])
        decisions = ctl.before_schedule(reqs)
        bound = ctl.plan_drafts(reqs)
        counted, tokens, verified = {}, {}, 0
        for req in reqs:
            k = decisions[req.request_id][1]
            accepted = 0
            while accepted < k and rng.random() < ACCEPT:
                accepted += 1
            tokens[req.request_id] = accepted + 1
            req.output_token_ids = req.output_token_ids + [9] * (accepted + 1)
            if k > 0:
                counted[req.request_id] = (k, accepted)
            verified += max(k, 0)
        seconds = (10.0 + 1.0 + 2.0 * verified + (1.0 if bound else 0.0)) * rng.uniform(0.95, 1.05) / 1e3
        ctl.after_output(decisions, counted, tokens, StepTiming(seconds, True, 2, bound))
        seen.append((tuple(d[1] for d in decisions.values()), bound))
        drafts = bound if bound is not None else N
    return seen


@pytest.mark.parametrize("name", sorted(PEERS))
def test_a_wrapped_peer_decides_as_the_peer_does(name):
    wrapped = Estimated(PEERS[name](N), N)
    assert drive(wrapped) == drive(PEERS[name](N))
    assert wrapped.estimate() is not None
    assert getattr(wrapped, "reads_confidences") == PEERS[name].reads_confidences
    for hook in ("gate", "plan", "begin_step", "observe_confidence"):
        assert callable(getattr(wrapped, hook, None)), hook
    assert getattr(wrapped, "contexts", None) is None  # the controller hands it no contexts
    # what /metrics reads of the calibration, the wrapped peer's own
    assert wrapped.calibrators is wrapped.inner.calibrators
    assert wrapped.confidence_seen is wrapped.inner.confidence_seen is PEERS[name].reads_confidences


def test_a_wrapped_phase_policy_stays_a_per_request_policy():
    wrapped = Estimated(PhasePolicy(1, 2), N)
    for hook in ("gate", "plan", "begin_step", "observe_confidence", "reads_confidences", "contexts"):
        assert getattr(wrapped, hook, None) is None, hook
    assert drive(wrapped) == drive(PhasePolicy(1, 2))
    assert wrapped.estimate() is not None
    assert wrapped.calibrators is None and wrapped.confidence_seen is False


def test_without_learned_costs_there_is_no_estimate():
    policy = Estimated(PhasePolicy(1, 2), N, learn_cost=False)
    drive(policy, steps=100)
    assert policy.estimate() is None
    assert policy.describe(Phase.ANSWER) == "depth=2"


@pytest.mark.parametrize("name", ["phase", *sorted(PEERS)])
def test_the_option_wraps_the_policy_and_nothing_is_wrapped_without_it(name):
    plain = build_policy(parse_options({"policy": name}, N))
    assert not isinstance(plain, Estimated)
    assert getattr(plain, "account_step", None) is None and getattr(plain, "estimate", None) is None
    wrapped = build_policy(parse_options({"policy": name, "live_estimate": True,
                                          "adaptive": {"verify_cost_ratio": 0.3, "window": 100.0}}, N),
                           idle_drafter_runs=True)
    assert isinstance(wrapped, Estimated) and type(wrapped.inner) is type(plain)
    assert wrapped.idle_drafter_runs and wrapped.n == N
    assert wrapped.cost.relative[2] == 0.3  # the prior's price of a verified draft
    assert DepthController(RULES, wrapped)._account is not None
    assert DepthController(RULES, plain)._account is None


def test_the_adaptive_policy_keeps_its_own_estimate():
    for flag in (True, False):
        policy = build_policy(parse_options({"policy": "adaptive", "live_estimate": flag}, N))
        assert isinstance(policy, AdaptivePolicy)
