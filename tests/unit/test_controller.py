import pytest

from dspark_dynamic.core.controller import DepthController
from dspark_dynamic.core.costs import context_units
from dspark_dynamic.core.phase import Phase, PhaseRules
from dspark_dynamic.core.policy import BatchDepth, PhasePolicy
from dspark_lab.fakes import FakeRequest

S, E = 5, 6
RULES = PhaseRules.of([S], [E])


def make(batch=BatchDepth.PER_REQUEST, reasoning=1, answer=2):
    return DepthController(RULES, PhasePolicy(reasoning, answer), batch)


def test_trims_by_phase_and_reassigns_shared_placeholder_list():
    ctl = make()
    shared = [-1, -1]  # the async scheduler hands every request the same placeholder list
    thinking = FakeRequest("a", [1, S], spec_token_ids=shared)
    answering = FakeRequest("b", [1, E], spec_token_ids=shared)
    decisions = ctl.before_schedule([thinking, answering])
    assert thinking.spec_token_ids == [-1]
    assert answering.spec_token_ids == [-1, -1]
    assert shared == [-1, -1]  # never mutated in place
    assert decisions == {"a": (Phase.REASONING, 1), "b": (Phase.ANSWER, 2)}


def test_phase_follows_committed_output_tokens():
    ctl = make()
    req = FakeRequest("a", [1, S], spec_token_ids=[7, 8])
    ctl.before_schedule([req])
    assert req.spec_token_ids == [7]
    req.output_token_ids += [9, E, 10]
    req.spec_token_ids = [7, 8]
    ctl.before_schedule([req])
    assert req.spec_token_ids == [7, 8]


def test_draft_tokens_never_change_the_phase():
    ctl = make()
    req = FakeRequest("a", [1, S], spec_token_ids=[E, 3])  # a draft </think> is not committed
    ctl.before_schedule([req])
    req.spec_token_ids = [E, 3]
    assert ctl.before_schedule([req])["a"] == (Phase.REASONING, 1)


def test_depth_zero_empties_drafts():
    ctl = make(reasoning=0)
    req = FakeRequest("a", [S], spec_token_ids=[1, 2])
    ctl.before_schedule([req])
    assert req.spec_token_ids == []


def test_batch_depth_max_and_min_make_the_step_uniform():
    for mode, expected in ((BatchDepth.MAX, [2, 2]), (BatchDepth.MIN, [1, 1])):
        ctl = make(batch=mode)
        a = FakeRequest("a", [S], spec_token_ids=[1, 2])
        b = FakeRequest("b", [E], spec_token_ids=[1, 2])
        ctl.before_schedule([a, b])
        assert [len(a.spec_token_ids), len(b.spec_token_ids)] == expected


def test_fewer_drafts_than_depth_are_left_alone():
    ctl = make(answer=2)
    req = FakeRequest("a", [E], spec_token_ids=[4])
    ctl.before_schedule([req])
    assert req.spec_token_ids == [4]


def test_after_output_counts_what_vllm_counted():
    ctl = make()
    a = FakeRequest("a", [S], spec_token_ids=[1, 2])
    b = FakeRequest("b", [E], spec_token_ids=[1, 2])
    c = FakeRequest("c", [E])  # no drafts this step (e.g. ngram found none)
    d = FakeRequest("d", [E], spec_token_ids=[1, 2])  # aborted while the step ran
    decisions = ctl.before_schedule([a, b, c, d])
    counted = {"a": (1, 1), "b": (2, 1)}  # vLLM's spec-decode stats: (verified, accepted)
    ctl.after_output(decisions, counted, {"a": 2, "b": 2, "c": 1})
    r, ans = ctl.stats.totals[Phase.REASONING], ctl.stats.totals[Phase.ANSWER]
    assert (r.steps, r.verified, r.accepted, r.tokens) == (1, 1, 1, 2)
    assert (ans.steps, ans.verified, ans.accepted, ans.tokens) == (1, 2, 1, 3)
    assert ans.accepted_per_pos == [1, 0]


def test_a_stop_token_cuts_tokens_but_not_what_was_verified():
    ctl = make()
    a = FakeRequest("a", [E], spec_token_ids=[1, 2])
    decisions = ctl.before_schedule([a])
    ctl.after_output(decisions, {"a": (2, 2)}, {"a": 1})  # 3 sampled, cut after the first (stop)
    ans = ctl.stats.totals[Phase.ANSWER]
    assert (ans.verified, ans.accepted, ans.tokens) == (2, 2, 1)


def test_forget_and_prune_release_state():
    ctl = make()
    reqs = [FakeRequest(str(i), [S], spec_token_ids=[1, 2]) for i in range(10)]
    ctl.before_schedule(reqs)
    assert len(ctl.states) == 10
    ctl.forget("0")
    ctl.prune({"1": None, "2": None})
    assert set(ctl.states) == {"1", "2"}


class RecordingPolicy(PhasePolicy):
    """The phase policy, remembering every depth() call and every observed step."""

    def __init__(self, reasoning, answer):
        super().__init__(reasoning, answer)
        self.calls, self.steps = [], []

    def depth(self, phase, request_id=None):
        self.calls.append((phase, request_id))
        return super().depth(phase, request_id)

    def observe_step(self, seconds, verified_tokens, num_requests, draft_depth):
        self.steps.append((seconds, verified_tokens, num_requests, draft_depth))


def test_plan_drafts_returns_the_deepest_next_depth():
    ctl = make()
    thinking, answering = FakeRequest("a", [1, S]), FakeRequest("b", [1, E])
    assert ctl.plan_drafts([thinking]) == 1  # only reasoning requests: draft one
    assert ctl.plan_drafts([thinking, answering]) == 2
    assert ctl.plan_drafts([]) is None
    assert make(batch=BatchDepth.MIN).plan_drafts([thinking, answering]) == 1


def test_the_next_step_uses_its_plan_unless_the_phase_changed():
    policy = RecordingPolicy(1, 2)
    ctl = DepthController(RULES, policy)
    req = FakeRequest("a", [1, S])
    ctl.plan_drafts([req])
    req.spec_token_ids = [7]
    assert ctl.before_schedule([req]) == {"a": (Phase.REASONING, 1)}
    assert len(policy.calls) == 1  # the plan was used, not a second decision
    ctl.plan_drafts([req])
    req.output_token_ids += [E]  # </think> committed after the plan was made
    req.spec_token_ids = [7]
    assert ctl.before_schedule([req]) == {"a": (Phase.ANSWER, 1)}  # re-decided: 2, but 1 was drafted
    assert policy.calls[-1] == (Phase.ANSWER, "a")


def test_a_depth_zero_plan_without_drafts_is_a_depth_zero_step():
    ctl = make(reasoning=0)
    req, other = FakeRequest("a", [1, S]), FakeRequest("b", [1, E])
    assert ctl.plan_drafts([req]) == 0  # the drafter is asked for nothing
    decisions = ctl.before_schedule([req, other])  # "b" has no plan and no drafts: none offered
    assert decisions == {"a": (Phase.REASONING, 0), "b": (Phase.ANSWER, -1)}
    ctl.after_output(decisions, {}, {"a": 1, "b": 1})
    assert ctl.stats.totals[Phase.REASONING].zero_depth_steps == 1
    assert ctl.stats.totals[Phase.ANSWER].zero_depth_steps == 0


def test_only_decode_only_steps_reach_the_cost_model():
    from dspark_dynamic.core.controller import StepTiming

    policy = RecordingPolicy(1, 2)
    ctl = DepthController(RULES, policy)
    a = FakeRequest("a", [S], spec_token_ids=[1, 2])
    decisions = ctl.before_schedule([a])
    ctl.after_output(decisions, {"a": (1, 1)}, {"a": 2}, step=StepTiming(0.5, False, 2, 1))  # a prefill rode along
    ctl.after_output(decisions, {"a": (1, 1)}, {"a": 2}, step=StepTiming(0.02, True, 1, 1))
    assert policy.steps == [(0.02, 1, 1, 1)]


def test_forget_drops_plans():
    ctl = make()
    ctl.plan_drafts([FakeRequest("a", [S])])
    ctl.forget("a")
    assert ctl.plans == {} and ctl.states == {}


# -- draft confidences ------------------------------------------------------------------------


def confident_controller(batch=BatchDepth.PER_REQUEST):
    from dspark_dynamic.core.adaptive import AdaptivePolicy

    policy = AdaptivePolicy(2, {Phase.REASONING: 1, Phase.ANSWER: 2}, learn_cost=False, verify_cost_ratio=0.5)
    for cal in policy.calibrators.values():
        cal.theta = [1.0, 0.0, 0.0]
        cal.cov = [[1e-12 if i == j else 0.0 for j in range(3)] for i in range(3)]  # a sure calibrator
    policy.min_labels = 0  # calibrated as if learned: the gate trusts it at once
    return DepthController(RULES, policy, batch)


def test_confidences_decide_each_request_once_and_calibrate_from_the_outcome():
    ctl = confident_controller()
    sure = FakeRequest("a", [1, S], spec_token_ids=[7, 8])
    doubtful = FakeRequest("b", [1, S], spec_token_ids=[7, 8])
    ctl.set_confidences("a", [6.0, 6.0])
    ctl.set_confidences("b", [-4.0, -4.0])
    decisions = ctl.before_schedule([sure, doubtful])
    # the phase policy would give both depth 1 (reasoning); the confidences say 2 and 0
    assert decisions == {"a": (Phase.REASONING, 2), "b": (Phase.REASONING, 0)}
    assert sure.spec_token_ids == [7, 8] and doubtful.spec_token_ids == []
    assert not ctl.confidences  # used once
    cal = ctl.policy.calibrators[Phase.REASONING]
    ctl.after_output(decisions, {"a": (2, 1)}, {"a": 2, "b": 1})
    assert (cal.report.labels, cal.report.observed) == (2, 1)  # draft 1 accepted, draft 2 rejected
    assert not ctl.verifying
    # next step without fresh confidences: the depth comes from the policy's plan again
    again = FakeRequest("a", [1, S], spec_token_ids=[9, 9])
    assert ctl.before_schedule([again])["a"][1] in (0, 1, 2)
    assert cal.report.labels == 2


def test_confidences_respect_a_uniform_batch_depth():
    ctl = confident_controller(BatchDepth.MAX)
    reqs = [FakeRequest("a", [1, S], spec_token_ids=[7, 8]), FakeRequest("b", [1, S], spec_token_ids=[7, 8])]
    ctl.set_confidences("a", [6.0, 6.0])
    ctl.set_confidences("b", [-4.0, -4.0])
    decisions = ctl.before_schedule(reqs)
    assert decisions["a"][1] == decisions["b"][1]


def test_confidences_are_ignored_without_a_gating_policy_and_dropped_on_forget():
    ctl = make()
    ctl.set_confidences("a", [6.0, 6.0])
    assert not ctl.confidences
    ctl = confident_controller()
    ctl.set_confidences("a", [6.0, 6.0])
    ctl.forget("a")
    assert not ctl.confidences


class CountingRules:
    """``RULES``, counting the tokens each tracker is advanced over."""

    def __init__(self):
        self.advanced = 0

    def track(self, request):
        tracker = RULES.track(request)
        rules = self

        class Counting:
            def advance(self, _rules, output_token_ids):
                rules.advanced += 1
                return tracker.advance(RULES, output_token_ids)

        return Counting()


def test_plan_drafts_reuses_the_phase_found_this_step_until_the_output_grows():
    counting = CountingRules()
    ctl = DepthController(counting, PhasePolicy(1, 2))
    req = FakeRequest("a", [1, S], spec_token_ids=[7, 8])
    ctl.before_schedule([req])
    assert counting.advanced == 1
    assert ctl.plan_drafts([req]) == 1  # same schedule call: the phase found above is reused
    assert counting.advanced == 1
    req.output_token_ids += [E]  # output committed in between (never in vLLM, but possible)
    assert ctl.plan_drafts([req]) == 2  # re-read: </think> ended reasoning
    assert counting.advanced == 2
    newcomer = FakeRequest("b", [1, S])  # scheduled without having been in ``running``
    assert ctl.plan_drafts([newcomer]) == 1
    assert counting.advanced == 3


class ContextPolicy(PhasePolicy):
    """The phase policy, reading contexts: remembers them at each depth() call, and every step."""

    def __init__(self):
        super().__init__(2, 2)
        self.contexts, self.seen, self.steps = {}, [], []

    def depth(self, phase, request_id=None):
        self.seen.append((request_id, self.contexts.get(request_id)))
        return super().depth(phase, request_id)

    def observe_step(self, seconds, verified_tokens, num_requests, draft_depth, context=0, verified_context=0):
        self.steps.append((verified_tokens, context, verified_context))


def test_a_policy_that_reads_contexts_gets_each_requests_context_and_each_steps():
    """Before a step's decisions, each request's prompt and output tokens; after it, the step's
    context and its verified drafts times their requests' contexts, a request freed before its
    last output counted at its last context."""
    from dspark_dynamic.core.controller import StepTiming

    policy = ContextPolicy()
    ctl = DepthController(RULES, policy)
    short = FakeRequest("s", [1] * 10 + [E], output_token_ids=[3, 4], spec_token_ids=[7, 8])
    long = FakeRequest("l", [1] * 4000 + [E], output_token_ids=[3], spec_token_ids=[7, 8])
    long.num_prompt_tokens = 4001  # vLLM's Request says so (a prompt of embeddings has no ids)
    s13, l4002, s15 = context_units(13), context_units(4002), context_units(15)
    decisions = ctl.before_schedule([short, long])
    assert policy.contexts == {"s": s13, "l": l4002}
    ctl.plan_drafts([short, long])
    assert ("s", s13) in policy.seen and ("l", l4002) in policy.seen
    ctl.forget("l")  # finished: vLLM frees it before its last output is accounted
    assert "l" not in policy.contexts
    ctl.after_output(decisions, {"s": (2, 1), "l": (2, 0)}, {"s": 2}, step=StepTiming(0.02, True, 2, 2))
    assert policy.steps == [(4, pytest.approx(s13 + l4002), pytest.approx(2 * s13 + 2 * l4002))]
    short.output_token_ids += [5, 6]
    short.spec_token_ids = [7, 8]
    decisions = ctl.before_schedule([short])
    ctl.after_output(decisions, {"s": (1, 1)}, {"s": 2}, step=StepTiming(0.02, True, 1, 2))
    assert policy.steps[-1] == (1, pytest.approx(s15), pytest.approx(s15))  # the freed request counted once


def test_a_requests_context_follows_its_output_at_every_step():
    """Refreshed only where its units change, a request's context is still what its prompt and
    output tokens say at every gate and plan (also where the output grew in between)."""
    import random

    rng = random.Random(3)
    policy = ContextPolicy()
    ctl = DepthController(RULES, policy)
    reqs = [FakeRequest(f"r{p}", [1] * p + [E]) for p in (0, 30, 1000, 4090, 70_000)]
    for _ in range(400):
        for r in reqs:
            r.output_token_ids += [3] * rng.randint(1, 9)
            r.spec_token_ids = [7, 8]
        ctl.before_schedule(reqs)
        assert policy.contexts == {r.request_id: context_units(len(r.prompt_token_ids) + len(r.output_token_ids))
                                   for r in reqs}
        grown = reqs[rng.randrange(len(reqs))]
        grown.output_token_ids += [3] * rng.randint(0, 40)  # the output grew after the schedule
        ctl.plan_drafts(reqs)
        assert policy.contexts[grown.request_id] == context_units(len(grown.prompt_token_ids)
                                                                  + len(grown.output_token_ids))


def test_a_policy_without_contexts_gets_the_step_as_before():
    from dspark_dynamic.core.controller import StepTiming

    policy = RecordingPolicy(2, 2)
    ctl = DepthController(RULES, policy)
    req = FakeRequest("a", [1, E], spec_token_ids=[7, 8])
    decisions = ctl.before_schedule([req])
    ctl.after_output(decisions, {"a": (2, 2)}, {"a": 3}, step=StepTiming(0.02, True, 1, 2))
    assert policy.steps == [(0.02, 2, 1, 2)]
