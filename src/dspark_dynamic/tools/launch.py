"""Launch ``vllm serve`` from a vLLM ``--config`` YAML plus an env file, after checking the plugin.

    dspark-dynamic-launch --config configs/deepseek-v4-flash-lvllm.yaml \
        --env configs/deepseek-v4-flash-lvllm.env [--dry-run] [-- extra vllm serve args]

Refuses to start (exit 2, one line) when vLLM is missing, the plugin's entry point is not
installed in this environment, ``VLLM_PLUGINS`` (after the env file) excludes it, or vLLM's plugin
loader does not load it.  ``--dry-run`` prints the environment additions and the final command.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys

PLUGIN_NAME = "dspark_dynamic"


class LaunchError(Exception):
    pass


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines; ``#`` comments, blank lines and an ``export`` prefix are allowed."""
    env: dict[str, str] = {}
    try:
        lines = open(path).read().splitlines()
    except OSError as exc:
        raise LaunchError(f"cannot read env file {path}: {exc}") from exc
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise LaunchError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def check_plugin(env: dict[str, str]) -> str:
    """Raise LaunchError unless vLLM would load this plugin; returns vLLM's version."""
    eps = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins") if ep.name == PLUGIN_NAME]
    if not eps:
        raise LaunchError(
            f"the {PLUGIN_NAME} plugin is not installed in this Python environment ({sys.executable}); "
            "pip install it into the environment that runs vLLM"
        )
    allowed = env.get("VLLM_PLUGINS", os.environ.get("VLLM_PLUGINS"))
    if allowed is not None and PLUGIN_NAME not in [p.strip() for p in allowed.split(",")]:
        raise LaunchError(f"VLLM_PLUGINS={allowed!r} excludes {PLUGIN_NAME}; add it to the list")
    try:
        import vllm
        import vllm.plugins
    except Exception as exc:
        raise LaunchError(f"vLLM is not importable in this environment: {exc}") from exc
    saved = os.environ.get("VLLM_PLUGINS")
    try:
        if allowed is not None:
            os.environ["VLLM_PLUGINS"] = allowed
        loaded = vllm.plugins.load_plugins_by_group("vllm.general_plugins")
    finally:
        if saved is None:
            os.environ.pop("VLLM_PLUGINS", None)
        else:
            os.environ["VLLM_PLUGINS"] = saved
    if PLUGIN_NAME not in loaded:
        raise LaunchError(f"vLLM's plugin loader did not load {PLUGIN_NAME} (see the log above)")
    return getattr(vllm, "__version__", "unknown")


def build_command(config: str, extra: list[str]) -> list[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "vllm")  # this environment's vllm
    vllm_bin = beside if os.access(beside, os.X_OK) else (shutil.which("vllm") or "vllm")
    return [vllm_bin, "serve", "--config", config, *extra]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dspark-dynamic-launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="vLLM --config YAML")
    ap.add_argument("--env", help="KEY=VALUE file to add to the environment")
    ap.add_argument("--dry-run", action="store_true", help="print what would run, do not start")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more vllm serve arguments")
    args = ap.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    try:
        if not os.path.isfile(args.config):
            raise LaunchError(f"config file not found: {args.config}")
        env_add = read_env_file(args.env) if args.env else {}
        version = check_plugin(env_add)
    except LaunchError as exc:
        print(f"dspark-dynamic-launch: refusing to start: {exc}", file=sys.stderr)
        return 2
    cmd = build_command(args.config, extra)
    if args.dry_run:
        print(f"# vLLM {version}; plugin {PLUGIN_NAME} installed and loaded")
        for key, value in env_add.items():
            print(f"export {key}={shlex.quote(value)}")
        print(shlex.join(cmd))
        return 0
    return subprocess.call(cmd, env={**os.environ, **env_add})


if __name__ == "__main__":
    sys.exit(main())
