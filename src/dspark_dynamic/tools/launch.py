"""Launch ``vllm serve`` from a preset or a vLLM ``--config`` YAML plus an env file, after
checking the plugin.

    dspark-dynamic-launch --preset deepseek-v4-flash-lvllm [--dry-run] [-- extra vllm serve args]
    dspark-dynamic-launch --config my.yaml [--env my.env] [--dry-run] [-- extra vllm serve args]
    dspark-dynamic-launch --list-presets
    dspark-dynamic-launch --copy-preset deepseek-v4-flash-lvllm DIR   # to edit model:, threads, ...
    dspark-dynamic-launch --copy-dashboard DIR                         # the Grafana dashboard JSON

A preset is a config YAML the package ships, with its env file (``--env`` replaces it).  Refuses
to start (exit 2, one line) when vLLM is missing, the plugin's entry point is not installed in
this environment, ``VLLM_PLUGINS`` (after the env file) excludes it, or vLLM's plugin loader does
not load it.  ``--dry-run`` prints the environment additions and the final command.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys

from dspark_dynamic.tools import data

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
    ap = argparse.ArgumentParser(
        prog="dspark-dynamic-launch",
        usage="%(prog)s (--preset NAME | --config FILE [--env FILE]) [--dry-run] [-- vllm serve args]\n"
              "       %(prog)s --list-presets | --copy-preset NAME DIR | --copy-dashboard DIR",
        description="Start `vllm serve` from a shipped preset or a vLLM --config YAML, after checking that vLLM "
                    "loads the dspark_dynamic plugin (exit 2 with one line if not).")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--preset", help="a shipped preset (--list-presets shows them)")
    what.add_argument("--config", help="vLLM --config YAML")
    what.add_argument("--list-presets", action="store_true", help="list the shipped presets and exit")
    what.add_argument("--copy-preset", nargs=2, metavar=("NAME", "DIR"), help="copy a preset's files into DIR")
    what.add_argument("--copy-dashboard", metavar="DIR", help="copy the Grafana dashboard JSON into DIR")
    ap.add_argument("--env", help="KEY=VALUE file to add to the environment (replaces a preset's own)")
    ap.add_argument("--dry-run", action="store_true", help="print what would run, do not start")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more vllm serve arguments")
    args = ap.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    try:
        if args.list_presets:
            for preset in data.presets().values():
                print(f"{preset.name}: {preset.summary}")
            return 0
        if args.copy_preset or args.copy_dashboard:
            if args.copy_preset:
                preset = data.preset(args.copy_preset[0])
                paths, folder = [p for p in (preset.config, preset.env) if p is not None], args.copy_preset[1]
            else:
                paths, folder = [data.dashboard()], args.copy_dashboard
            try:
                copies = data.copy_out(paths, folder)
            except (FileExistsError, OSError) as exc:
                print(f"dspark-dynamic-launch: refusing to copy: {exc}", file=sys.stderr)
                return 2
            for copy in copies:
                print(copy)
            return 0
        env_file = args.env
        if args.preset:
            preset = data.preset(args.preset)
            config = str(preset.config)
            env_file = env_file or (str(preset.env) if preset.env else None)
        else:
            config = args.config
        if not os.path.isfile(config):
            raise LaunchError(f"config file not found: {config}")
        beside = os.path.splitext(config)[0] + ".env"
        unused_env = beside if not env_file and os.path.isfile(beside) else None
        env_add = read_env_file(env_file) if env_file else {}
        version = check_plugin(env_add)
    except (LaunchError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else exc
        print(f"dspark-dynamic-launch: refusing to start: {message}", file=sys.stderr)
        return 2
    cmd = build_command(config, extra)
    if unused_env:
        print(f"dspark-dynamic-launch: note: {unused_env} beside the config is not used; pass --env {unused_env}",
              file=sys.stderr)
    if args.dry_run:
        print(f"# vLLM {version}; plugin {PLUGIN_NAME} installed and loaded")
        for key, value in env_add.items():
            print(f"export {key}={shlex.quote(value)}")
        print(shlex.join(cmd))
        return 0
    try:
        return subprocess.call(cmd, env={**os.environ, **env_add})
    except OSError as exc:
        print(f"dspark-dynamic-launch: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
