from dspark_dynamic.controller import DepthController
from dspark_dynamic.phase import Phase, PhaseRules
from dspark_dynamic.policy import BatchDepth, PhasePolicy
from dspark_dynamic.testing.fakes import FakeRequest

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


def test_after_output_counts_like_vllm():
    ctl = make()
    a = FakeRequest("a", [S], spec_token_ids=[1, 2])
    b = FakeRequest("b", [E], spec_token_ids=[1, 2])
    c = FakeRequest("c", [E])  # no drafts this step (e.g. ngram found none)
    decisions = ctl.before_schedule([a, b, c])
    scheduled = {"a": a.spec_token_ids, "b": b.spec_token_ids}
    ctl.after_output(decisions, {"a": 2, "b": 2, "c": 1}, scheduled)
    r, ans = ctl.stats.totals[Phase.REASONING], ctl.stats.totals[Phase.ANSWER]
    assert (r.steps, r.verified, r.accepted, r.tokens) == (1, 1, 1, 2)
    assert (ans.steps, ans.verified, ans.accepted, ans.tokens) == (1, 2, 1, 3)
    assert ans.accepted_per_pos == [1, 0]


def test_generated_counts_are_read_by_index():
    decisions = {"a": (Phase.ANSWER, 2), "gone": (Phase.ANSWER, 2)}
    counts = DepthController.generated_counts(decisions, [[1], [1, 2, 3]], {"a": 1})
    assert counts == {"a": 3}


def test_forget_and_prune_release_state():
    ctl = make()
    reqs = [FakeRequest(str(i), [S], spec_token_ids=[1, 2]) for i in range(10)]
    ctl.before_schedule(reqs)
    assert len(ctl.states) == 10
    ctl.forget("0")
    ctl.prune({"1": None, "2": None})
    assert set(ctl.states) == {"1", "2"}
