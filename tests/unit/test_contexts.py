"""Long and mixed contexts in the wall-clock benchmarks (no engine): which class each slot of the
closed loop gets and keeps, the prompts, the engines' settings, the new settings and claims."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dspark_lab import contexts
from dspark_lab.contexts import slot_classes, slot_queues
from dspark_lab.engine_pool import _run_closed_loop
from dspark_lab.wallclock import COPY, CONTEXT_SETTINGS, base_setting


def test_mixed_alternates_short_and_long_slots_and_refuses_one_in_flight():
    assert slot_classes("mixed", 2) == ("short", "long")
    assert slot_classes("mixed", 4) == ("short", "long", "short", "long")  # two of each
    assert slot_classes("long", 3) == ("long",) * 3 and slot_classes("short", 1) == ("short",)
    with pytest.raises(ValueError, match="concurrency 2 or more"):
        slot_classes("mixed", 1)
    with pytest.raises(ValueError, match="unknown context"):
        slot_classes("huge", 2)


def test_each_slot_queues_its_own_class_rotating_over_turns():
    prompts = {"short": [[1], [2], [3]], "long": [[11], [12], [13]]}
    classes = slot_classes("mixed", 4)
    turns = [slot_queues(classes, prompts, turn, per_slot=2) for turn in range(3)]
    for queues in turns:
        for cls, queue in zip(classes, queues):
            assert all(p in prompts[cls] for p in queue) and len(queue) == 2
        assert queues[0][0] != queues[2][0] and queues[1][0] != queues[3][0]  # same class, other documents
    assert turns[0] != turns[1]
    assert {p[0] for t in turns for q in t for p in q} == {1, 2, 3, 11, 12, 13}  # every document comes round


class FakeEngine:
    """vLLM's step API in miniature: every request gains one token a step and finishes after
    ``len(prompt)`` tokens (long prompts run longer); it records the prompts in flight."""

    def __init__(self) -> None:
        self.live: dict[str, list[int]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.in_flight: list[list[int]] = []

    def add_request(self, req_id, prompt, params):
        self.live[req_id], self.tokens[req_id] = prompt, []

    def step(self):
        self.in_flight.append(sorted(p[0] for p in self.live.values()))
        outs = []
        for req_id, prompt in list(self.live.items()):
            self.tokens[req_id].append(prompt[0])
            done = len(self.tokens[req_id]) >= len(prompt)
            outs.append(SimpleNamespace(request_id=req_id, finished=done,
                                        outputs=[SimpleNamespace(token_ids=list(self.tokens[req_id]))]))
            if done:
                del self.live[req_id]
        return outs


def test_a_finished_request_is_replaced_by_one_of_its_own_class():
    short, long = [[1] * 2, [2] * 2, [3] * 2], [[10] * 5, [20] * 5]  # short: 2 steps, long: 5
    engine, sent = FakeEngine(), []
    conn = SimpleNamespace(send=sent.append)
    cmd = {"prompt_ids": None, "max_tokens": 8, "end_id": -1, "start_phase": "answer", "slots": [short, long]}
    _run_closed_loop(engine, cmd, 0, lambda **kw: kw, lambda prompt_token_ids: prompt_token_ids, conn)
    timing = sent[0]["timing"]
    assert len(timing["outputs"]) == 5
    # after the first step (the second slot starts one step later), while both queues have more,
    # every step holds one short and one long request: 3 shorts of 2 steps beside a long of 5
    assert engine.in_flight[0] == [1]
    assert all(len(f) == 2 and f[0] < 10 <= f[1] for f in engine.in_flight[1:6])
    assert engine.in_flight[6:] == [[20]] * 5  # the shorts are done: the last long alone
    for (slot, place), out in zip(timing["origins"], timing["outputs"]):
        assert out == cmd["slots"][slot][place]  # the fake's output repeats its prompt
    assert sorted(map(tuple, timing["origins"])) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_testbed_prompts_hold_long_documents_and_end_as_the_script_prompt():
    from dspark_lab.testbed import TESTBED_SCRIPT, prompt_ids

    prompts = contexts.testbed_prompts(TESTBED_SCRIPT, slot_classes("mixed", 2))
    task = prompt_ids(TESTBED_SCRIPT, thinking=True)
    fillers = set(TESTBED_SCRIPT.filler_ids())
    assert set(prompts) == {"short", "long"} and all(len(ps) == contexts.DOCUMENTS for ps in prompts.values())
    for cls, least in (("short", contexts.SHORT_TOKENS), ("long", contexts.LONG_TOKENS)):
        for p in prompts[cls]:
            assert len(p) >= least and p[0] == task[0] and p[-len(task) + 1:] == task[1:]
            assert set(p[1:-len(task) + 1]) <= fillers  # a document: no chain or marker token
    assert len({tuple(p) for ps in prompts.values() for p in ps}) == 2 * contexts.DOCUMENTS
    contexts.check_fits(prompts, 300)
    with pytest.raises(ValueError, match="max_model_len"):
        contexts.check_fits(prompts, contexts.MAX_MODEL_LEN)


def test_long_context_copy_raises_the_position_table_and_links_the_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_DYNAMIC_MODEL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "cache" / "phase-draft-abc"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"max_position_embeddings": 1024, "hidden_size": 128}))
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    (src / "model.safetensors").write_bytes(b"weights")
    copy = contexts.long_context_copy(src)
    assert copy != src and not any(w in copy.name for w in ("dflash", "eagle", "dspark"))
    assert json.loads((copy / "config.json").read_text()) == {"max_position_embeddings": 8192, "hidden_size": 128}
    assert json.loads((copy / "tokenizer_config.json").read_text())["model_max_length"] == 8192
    assert (copy / "model.safetensors").stat().st_ino == (src / "model.safetensors").stat().st_ino
    assert contexts.long_context_copy(src) == copy and contexts.long_context_copy(copy) == copy


@pytest.fixture
def testbed(monkeypatch):
    from dspark_lab import wallclock

    models = ("target", {"method": "draft_model", "model": "draft"})
    monkeypatch.setattr(wallclock, "testbed_models", lambda shape, drafter: models)
    monkeypatch.setattr(contexts, "long_context_copy", lambda path: f"{path}-long")
    return wallclock


def test_adaptive_without_context_features_is_a_setting_on_both_paths(testbed):
    from dspark_lab.wallclock_real import engine_spec

    spec = testbed.engine_specs(("adaptive (no context)",), None)["adaptive (no context)"]
    assert spec["additional_config"]["dspark_dynamic"] == {"policy": "adaptive", "adaptive": {"context_features": False}}
    assert spec["speculative_config"]["num_speculative_tokens"] == 2
    real = engine_spec("adaptive (no context) N=3", "/models/target", {})
    assert real["additional_config"]["dspark_dynamic"] == {"policy": "adaptive", "adaptive": {"context_features": False}}
    assert real["speculative_config"] == {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 2,
                                          "num_speculative_tokens": 3}


def test_long_and_mixed_engines_have_prefix_caching_a_long_window_and_long_models(testbed):
    short = testbed.engine_specs(("fixed k=2", "adaptive"), None)
    long = testbed.engine_specs(("fixed k=2", "adaptive"), None, context="mixed")
    for name in ("fixed k=2", "adaptive"):
        assert "enable_prefix_caching" not in short[name]["engine"] and short[name]["model"] == "target"
        assert long[name]["engine"]["enable_prefix_caching"] is True
        assert long[name]["engine"]["max_model_len"] == contexts.MAX_MODEL_LEN
        assert long[name]["model"] == "target-long" and long[name]["speculative_config"]["model"] == "draft-long"


def test_context_runs_default_to_the_peers_and_an_a_a_pair_and_claim_the_comparisons():
    from dspark_dynamic.core.options import PEER_POLICIES
    from dspark_lab.wallclock import CLAIMS
    from dspark_lab.wallclock_real import CLAIMS as REAL_CLAIMS, CONTEXT_GROUPS, GROUPS

    copies = [n for n in CONTEXT_SETTINGS if n.endswith(COPY)]
    assert copies and all(base_setting(n) in CONTEXT_SETTINGS for n in copies)
    assert {"adaptive", "adaptive (no context)", "phase 0/0", "vllm-av", "freetoken"} <= set(CONTEXT_SETTINGS)
    assert ("adaptive", "adaptive (no context)") in CLAIMS and ("phase 0/0", "fixed k=0") in CLAIMS
    for group in CONTEXT_GROUPS:
        names = GROUPS[group]
        assert any(n.endswith(COPY) and n.removesuffix(COPY) in names for n in names)
    assert "ngram k=3" in GROUPS["context"] and "adaptive (no context) N=3" in GROUPS["context"]
    assert {f"{p} N=3" for p in PEER_POLICIES} <= set(GROUPS["context-peers"])
    assert ("adaptive N=3", "adaptive (no context) N=3") in REAL_CLAIMS["context"]


def test_the_peers_run_on_the_real_checkpoint_with_n_drafts():
    from dspark_lab.wallclock_real import engine_spec

    for peer in ("vllm-av", "freetoken", "break-even", "p-min"):
        spec = engine_spec(f"{peer} N=3", "/models/target", {})
        assert spec["additional_config"] == {"dspark_dynamic": {"policy": peer}}
        assert spec["speculative_config"]["num_speculative_tokens"] == 3
    long = engine_spec("ngram k=3", "/models/target", {}, {**contexts.ENGINE, "kv_cache_memory_bytes": 1 << 30})
    assert long["engine"]["enable_prefix_caching"] is True and long["engine"]["dtype"] == "float32"


def test_the_report_header_says_prompt_lengths_and_prefix_caching():
    from dspark_lab.wallclock_report import context_header

    prompts = {"short": [[0] * 210, [0] * 240, [0] * 300], "long": [[0] * 4100, [0] * 4150, [0] * 4200]}
    info = {"(ballast 0)": {"prefix_caching": False}, "a": {"prefix_caching": True}, "b": {"prefix_caching": True}}
    ctx = {"context": "mixed", "classes": ["short", "long"], "prompt_tokens": contexts.lengths(prompts),
           "prefix_caching": contexts.prefix_caching_line(info), "prefix_cache_hit_rate": {"a": 0.97, "b": 0.99}}
    header = "\n".join(context_header(ctx))
    assert "short 210/240/300, long 4100/4150/4200" in header
    assert "prefix caching: on in every engine" in header and "97.0%-99.0%" in header
    assert context_header({"context": "short"}) == []
