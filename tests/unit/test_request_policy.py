"""A depth policy per request: parsing the extra arguments, and the controller following them."""

import pytest

from dspark_dynamic.core.controller import DepthController
from dspark_dynamic.core.phase import Phase, PhaseRules
from dspark_dynamic.core.policy import BatchDepth, PhasePolicy
from dspark_dynamic.core.request_policy import RequestPolicy, RequestPolicyError, parse_request_policy
from dspark_dynamic.core.stats import PhaseStats
from dspark_lab.fakes import FakeRequest

S, E = 5, 6
RULES = PhaseRules.of([S], [E])


def parse(extra, server="adaptive", n=3, r=1, a=2):
    return parse_request_policy(extra, n, server, r, a)


# -- parsing -----------------------------------------------------------------------------------


def test_no_key_of_ours_is_the_servers_policy():
    assert parse(None) is None
    assert parse({}) is None
    assert parse({"kv_transfer_params": {"x": 1}, "other": 3}) is None


@pytest.mark.parametrize("extra, expected", [
    ({"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 2}, RequestPolicy("fixed 2", (2, 2))),
    ({"dspark_dynamic_depth": 0}, RequestPolicy("fixed 0", (0, 0))),
    ({"dspark_dynamic_depth": "3"}, RequestPolicy("fixed 3", (3, 3))),  # vllm_xargs text from a CLI
    ({"dspark_dynamic_policy": "phase", "dspark_dynamic_reasoning_depth": 0, "dspark_dynamic_answer_depth": 3},
     RequestPolicy("phase 0/3", (3, 0))),
    ({"dspark_dynamic_answer_depth": 3}, RequestPolicy("phase 1/3", (3, 1))),  # the other from the server
    ({"dspark_dynamic_policy": "phase"}, RequestPolicy("phase 1/2", (2, 1))),
    ({"dspark_dynamic_policy": "adaptive"}, RequestPolicy("adaptive", None)),
    ({"dspark_dynamic_policy": "server"}, RequestPolicy("adaptive", None)),
])
def test_valid_arguments(extra, expected):
    assert parse(extra) == expected


def test_server_policy_of_a_phase_server_is_labelled_by_its_depths():
    assert parse({"dspark_dynamic_policy": "server"}, server="phase") == RequestPolicy("phase 1/2", None)


@pytest.mark.parametrize("extra, key", [
    ({"dspark_dynamic_depth": 4}, "dspark_dynamic_depth"),  # above num_speculative_tokens
    ({"dspark_dynamic_depth": -1}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_depth": 1.5}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_depth": True}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_depth": "two"}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_depth": [1]}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_policy": "fixed"}, "dspark_dynamic_depth"),  # fixed needs a depth
    ({"dspark_dynamic_policy": "fast"}, "dspark_dynamic_policy"),
    ({"dspark_dynamic_policy": 2}, "dspark_dynamic_policy"),
    ({"dspark_dynamic_policy": "vllm-av"}, "dspark_dynamic_policy"),  # not what this server runs
    ({"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": 1, "dspark_dynamic_answer_depth": 1},
     "dspark_dynamic_answer_depth"),
    ({"dspark_dynamic_policy": "phase", "dspark_dynamic_depth": 1}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_policy": "adaptive", "dspark_dynamic_reasoning_depth": 1}, "dspark_dynamic_reasoning_depth"),
    ({"dspark_dynamic_reasoning_depth": 9}, "dspark_dynamic_reasoning_depth"),
    ({"dspark_dynamic_dpeth": 1}, "dspark_dynamic_dpeth"),  # a typo is refused, not ignored
])
def test_bad_arguments_name_the_key(extra, key):
    with pytest.raises(RequestPolicyError) as err:
        parse(extra)
    assert err.value.key == key
    assert repr(key) in str(err.value) and "allowed" in str(err.value)


def test_adaptive_is_refused_on_a_phase_server_with_what_it_runs():
    with pytest.raises(RequestPolicyError, match="this server runs 'phase'"):
        parse({"dspark_dynamic_policy": "adaptive"}, server="phase")


# -- the controller ----------------------------------------------------------------------------

OWN = {
    "zero": RequestPolicy("fixed 0", (0, 0)),
    "three": RequestPolicy("fixed 3", (3, 3)),
    "phase02": RequestPolicy("phase 0/2", (2, 0)),
}


def reader(request):
    return OWN.get(request.request_id)


def make(policy=None, batch=BatchDepth.PER_REQUEST, stats=None):
    return DepthController(RULES, policy or PhasePolicy(1, 2), batch, stats or PhaseStats(policy_label="phase 1/2"),
                           request_policy=reader)


def test_each_request_follows_its_own_depths():
    ctl = make()
    reqs = [FakeRequest(i, [1, S], spec_token_ids=[7, 8, 9]) for i in ("plain", "zero", "three", "phase02")]
    decisions = ctl.before_schedule(reqs)
    assert {r: k for r, (_p, k) in decisions.items()} == {"plain": 1, "zero": 0, "three": 3, "phase02": 0}
    for r in reqs:  # the answer phase: the server's answer depth, and each override's own
        r.output_token_ids.append(E)
        r.spec_token_ids = [7, 8, 9]
    decisions = ctl.before_schedule(reqs)
    assert {r: k for r, (_p, k) in decisions.items()} == {"plain": 2, "zero": 0, "three": 3, "phase02": 2}


def test_plans_bound_the_drafter_by_every_requests_own_depth():
    ctl = make()
    zero, plain = FakeRequest("zero", [1, S]), FakeRequest("plain", [1, S])
    assert ctl.plan_drafts([zero]) == 0  # speculation off: the drafter is asked for nothing
    assert ctl.plan_drafts([zero, plain]) == 1
    assert ctl.plan_drafts([FakeRequest("three", [1, S]), plain]) == 3


@pytest.mark.parametrize("mode, expected", [(BatchDepth.MAX, 3), (BatchDepth.MIN, 0)])
def test_a_uniform_batch_takes_the_max_or_min_over_every_request(mode, expected):
    ctl = make(batch=mode)
    reqs = [FakeRequest(i, [1, S], spec_token_ids=[7, 8, 9]) for i in ("plain", "zero", "three")]
    decisions = ctl.before_schedule(reqs)
    assert {k for _p, k in decisions.values()} == {expected}


def adaptive(batch=BatchDepth.PER_REQUEST, stats=None):
    from dspark_dynamic.core.adaptive import AdaptivePolicy

    policy = AdaptivePolicy(3, {Phase.REASONING: 1, Phase.ANSWER: 3}, learn_cost=False, verify_cost_ratio=50.0)
    return make(policy, batch, stats or PhaseStats(policy_label="adaptive"))


def test_under_a_batch_policy_an_override_takes_no_gate_decision_but_feeds_the_shared_model():
    ctl = adaptive()  # verifying is dear: the gate admits nothing for requests without an override
    gate_calls = []
    real_gate = ctl._gate

    def gate(items, uniform):
        gate_calls.append([item[1] for item in items])
        return real_gate(items, uniform)

    ctl._gate = gate
    reqs = [FakeRequest(i, [1, S], spec_token_ids=[7, 8, 9]) for i in ("plain", "three")]
    decisions = ctl.before_schedule(reqs)
    assert gate_calls == [["plain"]]
    assert decisions["three"] == (Phase.REASONING, 3) and decisions["plain"] == (Phase.REASONING, 0)
    observed = []
    ctl.policy.observe = lambda phase, v, a, req_id=None: observed.append((req_id, v, a))
    ctl.after_output(decisions, {"three": (3, 2)}, {"three": 3, "plain": 1})
    assert ("three", 3, 2) in observed  # the override's acceptance reaches the shared model
    # under max the gate's zero gives way to the override's three
    ctl = adaptive(BatchDepth.MAX)
    reqs = [FakeRequest(i, [1, S], spec_token_ids=[7, 8, 9]) for i in ("plain", "three")]
    assert {k for _p, k in ctl.before_schedule(reqs).values()} == {3}


def test_an_adaptive_plan_covers_only_the_requests_without_an_override():
    ctl = adaptive()
    planned = []
    real_plan = ctl._plan
    ctl._plan = lambda rows: planned.append([r for _p, r in rows]) or real_plan(rows)
    assert ctl.plan_drafts([FakeRequest("three", [1, S]), FakeRequest("plain", [1, S])]) == 3
    assert planned == [["plain"]]
    planned.clear()
    assert ctl.plan_drafts([FakeRequest("zero", [1, S])]) == 0
    assert planned == []  # no request left for the policy


def test_counts_per_policy_sum_to_the_totals():
    stats = PhaseStats(policy_label="phase 1/2")
    ctl = make(stats=stats)
    reqs = [FakeRequest(i, [1, S], spec_token_ids=[7, 8, 9]) for i in ("plain", "zero", "three")]
    decisions = ctl.before_schedule(reqs)
    ctl.after_output(decisions, {"plain": (1, 1), "three": (3, 1)}, {"plain": 2, "zero": 1, "three": 2})
    snap = stats.policy_snapshot()
    assert set(snap) == {"phase 1/2", "fixed 0", "fixed 3"}
    assert snap["fixed 3"]["reasoning"]["verified"] == 3 and snap["fixed 3"]["reasoning"]["accepted"] == 1
    assert snap["fixed 0"]["reasoning"]["zero_depth_steps"] == 1 and snap["fixed 0"]["reasoning"]["tokens"] == 1
    assert snap["phase 1/2"]["reasoning"]["verified"] == 1 and snap["phase 1/2"]["reasoning"]["tokens"] == 2
    for key in ("steps", "verified", "accepted", "tokens", "zero_depth_steps"):
        assert sum(p["reasoning"][key] for p in snap.values()) == getattr(stats.totals[Phase.REASONING], key)


def test_forget_drops_a_requests_own_policy():
    ctl = make()
    ctl.before_schedule([FakeRequest("three", [1, S], spec_token_ids=[7])])
    assert "three" in ctl.overrides and "three" in ctl.labels
    ctl.forget("three")
    assert not ctl.overrides and not ctl.labels
    # vLLM frees a finished request before its last step's output: that step keeps its label
    ctl.after_output({"three": (Phase.REASONING, 1)}, {"three": (1, 1)}, {})
    assert ctl.stats.policy_snapshot()["fixed 3"]["reasoning"]["verified"] == 1
    assert not ctl._ended


def test_the_reader_runs_once_per_request():
    calls = []
    ctl = DepthController(RULES, PhasePolicy(1, 2), request_policy=lambda r: calls.append(r.request_id) or None)
    req = FakeRequest("a", [1, S], spec_token_ids=[7, 8])
    for _ in range(3):
        ctl.before_schedule([req])
        ctl.plan_drafts([req])
    assert calls == ["a"]
