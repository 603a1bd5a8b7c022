"""The batch simulator with a context term (dspark_lab.simulate_context): the cost, the oracle, the driver."""

import argparse

import pytest

from dspark_dynamic.core.costs import context_units
from dspark_dynamic.core.phase import Phase
from dspark_lab.simulate import CostModel
from dspark_lab.simulate_context import (CONTEXTS, ContextCost, ContextOracle, FixedRule, Slot, compare_mix,
                                         run_batch, table)
from dspark_lab.workloads import ConfidenceModel

SHORT, LONG = CONTEXTS["1k"], CONTEXTS["128k"]


def test_a_verified_draft_of_a_long_request_costs_the_context_term_more():
    cost = ContextCost(CostModel(), request_ms=37.75, ctx_base_ns=0.5, ctx_verify_ns=2.0)
    contexts = [SHORT, LONG]
    neither = cost.step_ms([0, 0], contexts, 2)
    short_one, long_one = cost.step_ms([1, 0], contexts, 2), cost.step_ms([0, 1], contexts, 2)
    assert short_one - neither == pytest.approx(37.75 + 2.0e-6 * SHORT)
    assert long_one - short_one == pytest.approx(2.0e-6 * (LONG - SHORT))
    # each request's own row reads its context too: the base term
    assert neither - cost.step_ms([0, 0], [SHORT, SHORT], 2) == pytest.approx(0.5e-6 * (LONG - SHORT))
    assert neither == pytest.approx(75.0 + 37.75 + 3.0 + 0.5e-6 * (SHORT + LONG))
    ap = argparse.ArgumentParser()
    CostModel.add_arguments(ap)
    ContextCost.add_arguments(ap)
    testbed = ContextCost.from_arguments(ap.parse_args(["--context-costs", "testbed"]))
    seed = ContextCost.from_arguments(ap.parse_args(["--ctx-verify-ns", "5"]))
    assert testbed.ctx_verify_ns == testbed.ctx_base_ns == 3200.0 and testbed.request_ms == 37.75
    assert seed.ctx_verify_ns == 5.0 and seed.ctx_base_ns == 0.75


def test_the_oracle_admits_a_short_requests_draft_before_a_long_ones_at_equal_acceptance():
    model = ConfidenceModel.with_auc(0.85)
    cost = ContextCost(ctx_base_ns=3200.0, ctx_verify_ns=3200.0)  # 41 ms a draft at 1k, 457 ms at 128k
    for order in (("short", "long"), ("long", "short")):
        oracle = ContextOracle(2, cost, model, rate=1 / 200)  # tokens per ms: a draft worth 0.2 vs 2.3 tokens
        oracle.tokens.update(short=SHORT, long=LONG)
        oracle.truth.update(short=(0.8,) * 6, long=(0.8,) * 6)
        items = [(Phase.ANSWER, req, [model.right] * 2, 2) for req in order]
        depths = dict(zip(order, oracle.gate(items)))
        assert depths == {"short": 2, "long": 0}
    blind = ContextOracle(2, cost, model, rate=1 / 200, context_aware=False)
    blind.tokens.update(short=SHORT, long=LONG)
    blind.truth.update(short=(0.8,) * 6, long=(0.8,) * 6)
    a, b = blind.gate([(Phase.ANSWER, req, [model.right] * 2, 2) for req in ("short", "long")])
    assert a == b  # priced at the batch's mean context, both alike


class Recorder(FixedRule):
    """Verifies one draft; records what ``contexts`` held at each plan and gate, and each step."""

    def __init__(self, profiling: bool = False) -> None:
        super().__init__(1)
        self.contexts: dict[str, int] = {}
        self.seen: list[tuple[str, dict]] = []
        self.steps: list[tuple] = []
        self.forgotten: list[str] = []
        if profiling:
            self.profile = type("Profile", (), {"profiling": True})()

    def plan(self, rows):
        self.seen.append(("plan", {req: self.contexts.get(req) for _p, req in rows}))
        return super().plan(rows)

    def gate(self, items):
        self.seen.append(("gate", {req: self.contexts.get(req) for _p, req, _f, _a in items}))
        return super().gate(items)

    def observe_step(self, seconds, verified_tokens, num_requests, draft_depth, context=0, verified_context=0):
        self.steps.append((seconds, verified_tokens, num_requests, context, verified_context, dict(self.contexts)))

    def forget(self, request_id):
        self.forgotten.append(request_id)


def _slots():
    """Two requests of 4 and 8 positions (each accepts its one draft: 2 tokens a step), then more."""
    answer = (Phase.ANSWER, 1, (0.9,) * 6)
    short = [[answer] * 4, [answer] * 4]
    long = [[answer] * 8]
    return [Slot("a", SHORT, short, [[[2.0, 2.0]] * 4] * 2), Slot("b", LONG, long, [[[2.0, 2.0]] * 8])]


def test_the_driver_sets_each_requests_context_before_plan_and_gate_and_drops_finished_ones():
    policy, cost = Recorder(), ContextCost()
    u = context_units
    run_batch("recorder", policy, _slots(), cost, 3)
    expected = [{"a-0": u(SHORT), "b-0": u(LONG)}, {"a-0": u(SHORT + 2), "b-0": u(LONG + 2)},
                {"a-1": u(SHORT), "b-0": u(LONG + 4)}]
    assert policy.seen == [(call, want) for want in expected for call in ("plan", "gate")]
    assert policy.forgotten == ["a-0"]  # finished after two steps: forgotten, its context dropped
    first, second, third = policy.steps
    both = u(SHORT) + u(LONG)
    assert first[1:5] == (2, 2, pytest.approx(both), pytest.approx(both))  # one draft each: verified x context
    assert first[0] == pytest.approx(cost.step_ms([1, 1], [SHORT, LONG], 1) / 1000.0)
    assert "a-0" not in policy.contexts and policy.contexts == {"a-1": u(SHORT), "b-0": u(LONG + 4)}
    assert third[3] == pytest.approx(u(SHORT) + u(LONG + 4))  # ... the next request in its slot, at its prompt


def test_a_policy_still_profiling_is_told_the_step_at_the_profile_context():
    policy, cost = Recorder(profiling=True), ContextCost(ctx_base_ns=3200.0, ctx_verify_ns=3200.0)
    run_batch("recorder", policy, _slots(), cost, 1, profile_context=8192)
    assert policy.steps[0][0] == pytest.approx(cost.step_ms([1, 1], [8192, 8192], 1) / 1000.0)
    assert policy.steps[0][3] == pytest.approx(context_units(SHORT) + context_units(LONG))  # the step's own


def test_a_tiny_run_compares_every_policy_against_the_oracle():
    results = compare_mix([SHORT, LONG], ContextCost(ctx_base_ns=3200.0, ctx_verify_ns=3200.0), steps=150)
    names = [r.name for r in results]
    assert names == ["fixed k=0 (no speculation)", "fixed k=1", "fixed k=2", "phase 1/2",
                     "adaptive, context features off", "adaptive, context features on",
                     "peer: vllm-av (profiled at 8192)", "peer: freetoken width",
                     "oracle, calibrated, context-blind", "oracle, calibrated"]
    assert all(r.steps == 150 and r.tokens >= 300 for r in results)
    text = table("1k + 128k", results).splitlines()
    assert "vs oracle" in text[1] and len(text) == 2 + len(names)
    assert all(line.startswith(name) for line, name in zip(text[2:], names))
    assert text[-1].split()[-3] == "1.000"  # the oracle against itself
    # the oracle that prices each draft at its own context does at least as well as the one that does not
    assert results[-1].tok_per_s >= results[-2].tok_per_s
