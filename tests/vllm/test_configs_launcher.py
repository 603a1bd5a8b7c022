"""The shipped presets parse with vLLM's own parser; the launcher checks, lists, copies and prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from dspark_dynamic.core.options import parse_options  # noqa: E402
from dspark_dynamic.adapter.patches.config_alias import rewrite_alias  # noqa: E402
from dspark_dynamic.tools import data  # noqa: E402
from dspark_dynamic.tools.launch import LaunchError, read_env_file  # noqa: E402

PRESETS = data.presets()
SEED = PRESETS["deepseek-v4-flash-lvllm"]


def serve_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # older layouts
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


def test_the_presets_are_the_shipped_yaml_files():
    assert set(PRESETS) == {"deepseek-v4-flash-lvllm", "deepseek-v4-flash-vllm033"}
    assert all(p.summary.startswith("DeepSeek-V4-Flash") for p in PRESETS.values())
    with pytest.raises(KeyError, match="known: deepseek-v4-flash-lvllm"):
        data.preset("nope")


@pytest.mark.parametrize("preset", PRESETS.values(), ids=lambda p: p.name)
def test_config_loads_with_vllms_parser_and_means_dspark_plus_controller(preset):
    args = serve_parser().parse_args(["--config", str(preset.config)])
    assert args.reasoning_parser == "deepseek_v4"
    assert args.kv_cache_dtype == "fp8_ds_mla"
    assert args.max_num_seqs == 2
    assert args.compilation_config.cudagraph_mode.name == "FULL_DECODE_ONLY"
    assert args.async_scheduling is False  # stated in the YAML: the plugin's features need sync
    # the alias rewrite as it runs on EngineArgs (the model path does not exist here)
    engine_args = SimpleNamespace(speculative_config=args.speculative_config,
                                  additional_config=args.additional_config, spec_method=args.spec_method)
    rewrite_alias(engine_args)
    assert engine_args.speculative_config["method"] == "dspark"
    assert engine_args.speculative_config["num_speculative_tokens"] == 2
    options = parse_options(engine_args.additional_config["dspark_dynamic"], 2)
    assert (options.reasoning_depth, options.answer_depth) == (1, 2)


def test_lvllm_env_file():
    env = read_env_file(str(SEED.env))
    assert env["LVLLM_MOE_NUMA_ENABLED"] == "1"
    assert env["LVLLM_GPU_RESIDENT_MOE_LAYERS"] == "0,1"
    assert "LK_THREADS" in env
    assert "VLLM_PLUGINS" not in env  # never narrow the user's plugins (the fork registers its own)


def test_env_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.env"
    bad.write_text("OK=1\nthis is not an assignment\n")
    with pytest.raises(LaunchError, match="bad.env:2"):
        read_env_file(str(bad))


def launch(*args, env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "dspark_dynamic.tools.launch", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_dry_run_of_the_seed_preset_prints_the_final_command():
    proc = launch("--preset", "deepseek-v4-flash-lvllm", "--dry-run", "--", "--port", "8011")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert "plugin dspark_dynamic installed and loaded" in lines[0]
    assert "export LVLLM_GPU_RESIDENT_MOE_LAYERS=0,1" in lines  # the preset's own env file
    assert lines[-1].endswith(f"serve --config {SEED.config} --port 8011")


def test_a_copied_preset_launches_from_its_copy(tmp_path):
    proc = launch("--copy-preset", "deepseek-v4-flash-lvllm", str(tmp_path / "box"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    config, env = (tmp_path / "box" / "deepseek-v4-flash-lvllm.yaml"), (tmp_path / "box" / "deepseek-v4-flash-lvllm.env")
    assert proc.stdout.split() == [str(config), str(env)]
    config.write_text(config.read_text().replace("/models/DeepSeek-V4-Flash-0731", "/srv/v4"))
    proc = launch("--config", str(config), "--env", str(env), "--dry-run")
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1].endswith(f"serve --config {config}")
    assert "not used" not in proc.stderr
    without_env = launch("--config", str(config), "--dry-run")  # the env file beside it is named, not dropped silently
    assert without_env.returncode == 0 and f"{env} beside the config is not used; pass --env {env}" in without_env.stderr
    again = launch("--copy-preset", "deepseek-v4-flash-lvllm", str(tmp_path / "box"))
    assert again.returncode == 2 and "refusing to copy" in again.stderr and "exists" in again.stderr
    assert "Traceback" not in again.stderr


def test_list_presets_and_copy_dashboard(tmp_path):
    listed = launch("--list-presets")
    assert listed.returncode == 0
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == sorted(PRESETS)
    copied = launch("--copy-dashboard", str(tmp_path))
    assert copied.returncode == 0 and (tmp_path / "dspark_dynamic.json").read_bytes() == data.dashboard().read_bytes()


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--config", "nope.yaml"], None, "config file not found"),
        (["--preset", "nope"], None, "no preset 'nope'; known: deepseek-v4-flash-lvllm"),
        (["--preset", "deepseek-v4-flash-vllm033"], {"VLLM_PLUGINS": "other"}, "excludes dspark_dynamic"),
    ],
)
def test_launcher_refuses_clearly(args, env, message):
    proc = launch(*args, "--dry-run", env_extra=env)
    assert proc.returncode == 2
    assert "refusing to start" in proc.stderr and message in proc.stderr and "Traceback" not in proc.stderr
