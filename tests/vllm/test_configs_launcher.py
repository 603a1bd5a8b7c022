"""The shipped launch configs parse with vLLM's own parser; the launcher checks and prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from dspark_dynamic.core.options import parse_options  # noqa: E402
from dspark_dynamic.adapter.patches.config_alias import rewrite_alias  # noqa: E402
from dspark_dynamic.tools.launch import LaunchError, read_env_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def serve_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # older layouts
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config_loads_with_vllms_parser_and_means_dspark_plus_controller(config):
    args = serve_parser().parse_args(["--config", str(config)])
    assert args.reasoning_parser == "deepseek_v4"
    assert args.kv_cache_dtype == "fp8_ds_mla"
    assert args.max_num_seqs == 2
    assert args.compilation_config.cudagraph_mode.name == "FULL_DECODE_ONLY"
    # the alias rewrite as it runs on EngineArgs (the model path does not exist here)
    engine_args = SimpleNamespace(speculative_config=args.speculative_config,
                                  additional_config=args.additional_config, spec_method=args.spec_method)
    rewrite_alias(engine_args)
    assert engine_args.speculative_config["method"] == "dspark"
    assert engine_args.speculative_config["num_speculative_tokens"] == 2
    options = parse_options(engine_args.additional_config["dspark_dynamic"], 2)
    assert (options.reasoning_depth, options.answer_depth) == (1, 2)


def test_lvllm_env_file():
    env = read_env_file(str(ROOT / "configs" / "deepseek-v4-flash-lvllm.env"))
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


def test_dry_run_prints_the_final_command():
    proc = launch("--config", "configs/deepseek-v4-flash-lvllm.yaml", "--env", "configs/deepseek-v4-flash-lvllm.env",
                  "--dry-run", "--", "--port", "8011")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert "plugin dspark_dynamic installed and loaded" in lines[0]
    assert "export LVLLM_GPU_RESIDENT_MOE_LAYERS=0,1" in lines
    assert lines[-1].endswith("serve --config configs/deepseek-v4-flash-lvllm.yaml --port 8011")


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--config", "configs/nope.yaml"], None, "config file not found"),
        (["--config", "configs/deepseek-v4-flash-vllm033.yaml"], {"VLLM_PLUGINS": "other"}, "excludes dspark_dynamic"),
    ],
)
def test_launcher_refuses_clearly(args, env, message):
    proc = launch(*args, "--dry-run", env_extra=env)
    assert proc.returncode == 2
    assert "refusing to start" in proc.stderr and message in proc.stderr and "Traceback" not in proc.stderr
