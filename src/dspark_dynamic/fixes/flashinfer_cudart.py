"""FlashInfer libcudart lookup fix, applied at start-up in every vLLM process.

The bug: ``find_loaded_library("libcudart")`` in ``flashinfer/comm/cuda_ipc.py`` (<= 0.7.0.post1)
and FlashInfer's experimental b12x ``_find_loaded_library`` take the first ``/proc/self/maps``
line that merely *contains* ``libcudart``.  With TileLang's ``libcudart_stub.so`` mapped at a
lower address they bind the stub, and vLLM dies with ``undefined symbol: cudaDeviceReset``.

The replacement (``find_loaded_library``) matches the mapped *file name*
(``libcudart.so[.N…]`` or ``libcudart-<hex>.so[.N…]``), never returns deleted or pseudo mappings,
prefers the copy the process's global symbol scope resolves ``cudaGetErrorString`` to (the
runtime torch uses), and returns a copy only if it exports every function FlashInfer binds.

Application, per target module (see ``TARGETS``), decided by behaviour, not version strings:
the installed function is cloned with ``open`` redirected to a synthetic maps listing (stub
first, real runtime second); only a function that does not return the real runtime is replaced.
- module not imported yet: a ``sys.meta_path`` finder wraps its loader and, before the module
  body runs, inserts ``name = <checked replacement>`` right after the function's ``def`` (old
  FlashInfer builds ``cudart = CudaRTLibrary()`` while importing, so a post-import patch is too
  late); FlashInfer and its parent packages are never imported by this module;
- module already imported: the attribute is rebound in place.

``DSPARK_DYNAMIC_CUDART_FIX=0`` turns it off.  Never raises; logs once per patched module;
``status()`` reports what happened in this process.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.abc
import importlib.machinery
import io
import logging
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

from dspark_dynamic.adapter.patching import find_spec_with_wrapped_loader

logger = logging.getLogger("vllm.dspark_dynamic")

ENV_SWITCH = "DSPARK_DYNAMIC_CUDART_FIX"
# module -> name of its libcudart lookup function
TARGETS: dict[str, str] = {
    "flashinfer.comm.cuda_ipc": "find_loaded_library",
    "flashinfer.experimental.b12x.comm.pcie._cuda_ipc": "_find_loaded_library",
    "vllm.utils.system_utils": "find_loaded_library",
    "vllm.distributed.device_communicators.cuda_wrapper": "find_loaded_library",
    "vllm.device_allocator.cumem": "find_loaded_library",
}
# Every function FlashInfer's CudaRTLibrary classes (comm, b12x) bind; TileLang's stub lacks
# cudaDeviceReset.
REQUIRED_SYMBOLS = (
    "cudaSetDevice",
    "cudaDeviceSynchronize",
    "cudaDeviceReset",
    "cudaGetErrorString",
    "cudaMalloc",
    "cudaFree",
    "cudaMemset",
    "cudaMemcpy",
    "cudaIpcGetMemHandle",
    "cudaIpcOpenMemHandle",
    "cudaIpcCloseMemHandle",
    "cudaMemcpyAsync",
)
_HOOK_NAME = "__dspark_dynamic_cudart_choose__"
_MARK = "__dspark_dynamic_cudart_fix__"

_lock = threading.RLock()
_status: dict[str, str] = {}
_finder: "_Finder | None" = None


# ---- the replacement lookup ---------------------------------------------------------------

def is_library_filename(filename: str, lib_name: str) -> bool:
    """Whether a mapped file's name is ``lib_name`` itself, not a lookalike.

    Accepted: ``lib.so``, ``lib.so.12.4``, a name-mangled ``lib-<hex>.so.11.0``; for names other
    than libcudart also a tagged extension module ``lib.abi3.so`` (vLLM's cumem_allocator).
    Never: ``lib_stub.so``, ``lib_static.a``, ``lib-stub.so``.
    """
    name = re.escape(lib_name)
    if re.fullmatch(rf"{name}(?:-[0-9a-fA-F]+)?\.so(?:\.\d+)*", filename):
        return True
    return lib_name != "libcudart" and re.fullmatch(rf"{name}(?:\.[A-Za-z0-9_]+)+\.so", filename) is not None


def mapped_paths(lines: Iterable[str]) -> list[str]:
    """File-backed mappings of a maps listing, in order, deduplicated.

    Skips anonymous and pseudo entries (``[heap]``, ``[vdso]``, ``[anon:…]``), memfd and
    other non-absolute names, and mappings of deleted files.  Paths may contain spaces.
    """
    seen: dict[str, None] = {}
    for line in lines:
        fields = line.rstrip("\n").split(None, 5)
        if len(fields) < 6:
            continue
        path = fields[5]
        if not path.startswith("/") or path.endswith(" (deleted)"):
            continue
        seen.setdefault(path, None)
    return list(seen)


def _read_maps() -> list[str]:
    with open("/proc/self/maps", "rb") as f:
        return [os.fsdecode(raw) for raw in f.read().splitlines()]


def global_scope_path(symbol: str = "cudaGetErrorString") -> str | None:
    """The file that the process-global scope resolves ``symbol`` to (dlsym + dladdr)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    try:
        process = ctypes.CDLL(None)
        address = ctypes.cast(getattr(process, symbol), ctypes.c_void_p).value
        for lib in (process, ctypes.CDLL("libdl.so.2")):
            dladdr = getattr(lib, "dladdr", None)
            if dladdr is None:
                continue
            dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
            info = DlInfo()
            if dladdr(address, ctypes.byref(info)) and info.dli_fname:
                return os.fsdecode(info.dli_fname)
    except (AttributeError, OSError):
        return None
    return None


def exports(path: str, symbols: Iterable[str]) -> bool:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return False
    return all(hasattr(lib, s) for s in symbols)


def choose_cudart(
    paths: list[str],
    preferred: str | None,
    has_symbols: Callable[[str], bool],
) -> str | None:
    """Among mapped paths, the libcudart to bind: the preferred copy first, then map order."""
    candidates = [p for p in paths if is_library_filename(os.path.basename(p), "libcudart")]
    if preferred is not None:
        real = os.path.realpath(preferred)
        candidates.sort(key=lambda p: os.path.realpath(p) != real)
    for path in candidates:
        if has_symbols(path):
            return path
    return None


def find_loaded_library(lib_name: str) -> str | None:
    """Drop-in for FlashInfer's / vLLM's ``find_loaded_library`` (same signature)."""
    paths = mapped_paths(_read_maps())
    if lib_name == "libcudart":
        return choose_cudart(paths, global_scope_path(), lambda p: exports(p, REQUIRED_SYMBOLS))
    for path in paths:
        if is_library_filename(os.path.basename(path), lib_name):
            return path
    return None


setattr(find_loaded_library, _MARK, True)


# ---- deciding by behaviour ----------------------------------------------------------------

STUB_PATH = "/opt/x/site-packages/tilelang/lib/libcudart_stub.so"
REAL_PATH = "/opt/x/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
SYNTHETIC_MAPS = (
    "7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]\n"
    f"7f1000000000-7f1000001000 r-xp 00000000 08:01 11 {STUB_PATH}\n"
    f"7f2000000000-7f2000001000 r-xp 00000000 08:01 12 {REAL_PATH}\n"
)


def _clone_with_maps(func: types.FunctionType, maps_text: str) -> types.FunctionType:
    """Copy ``func`` (and its same-module helpers) so ``open('/proc/self/maps')`` reads text."""
    real_open = open

    def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(file) == "/proc/self/maps":
            return io.BytesIO(maps_text.encode()) if "b" in mode else io.StringIO(maps_text)
        return real_open(file, mode, *args, **kwargs)

    env = dict(func.__globals__)
    env["open"] = fake_open
    for name, value in list(env.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == func.__module__:
            env[name] = types.FunctionType(value.__code__, env, value.__name__, value.__defaults__, value.__closure__)
    return types.FunctionType(func.__code__, env, func.__name__, func.__defaults__, func.__closure__)


def misbehaves(func: Any) -> bool:
    """True if ``func`` does not pick the real runtime out of the synthetic stub-first listing."""
    if getattr(func, _MARK, False):
        return False
    if not isinstance(func, types.FunctionType):
        return True
    try:
        return _clone_with_maps(func, SYNTHETIC_MAPS)("libcudart") != REAL_PATH
    except Exception:
        return True  # e.g. the old assert on the stub's file name


def _checked(func: Any, module_name: str, how: str) -> Any:
    """The function to keep in ``module_name``: ``func`` if it behaves, else the replacement."""
    if misbehaves(func):
        _status[module_name] = how
        logger.info(
            "dspark_dynamic: cudart fix: replaced %s.%s (%s): it picked a libcudart stub by substring",
            module_name,
            TARGETS[module_name],
            how,
        )
        return find_loaded_library
    _status.setdefault(module_name, "upstream-ok (kept)")
    return func


# ---- applying -----------------------------------------------------------------------------

def _patch_imported(module: types.ModuleType) -> None:
    name = module.__name__
    attr = TARGETS[name]
    func = getattr(module, attr, None)
    if func is None:
        _status[name] = "no such function (skipped)"
        return
    chosen = _checked(func, name, "post-hoc (already imported)")
    if chosen is not func:
        setattr(module, attr, chosen)


class _Loader(importlib.abc.Loader):
    def __init__(self, wrapped: Any, fullname: str) -> None:
        self._wrapped = wrapped
        self._fullname = fullname

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        attr = TARGETS[self._fullname]
        source = None
        try:
            source = self._wrapped.get_source(self._fullname)
        except Exception:
            source = None
        tree = None
        if source and f"def {attr}(" in source:
            try:
                tree = ast.parse(source, filename=getattr(module.__spec__, "origin", "<module>"))
            except SyntaxError:
                tree = None
        if tree is not None:
            for i, node in enumerate(tree.body):
                if isinstance(node, ast.FunctionDef) and node.name == attr:
                    call = ast.parse(f"{attr} = {_HOOK_NAME}({attr}, __name__)").body[0]
                    tree.body.insert(i + 1, ast.copy_location(call, node))
                    break
            else:
                tree = None
        if tree is None:  # the function is imported from elsewhere, or no source
            self._wrapped.exec_module(module)
            with _lock:
                _patch_imported(module)
            return
        ast.fix_missing_locations(tree)
        module.__dict__[_HOOK_NAME] = lambda func, name: _checked(func, name, "pre-exec (source rewrite)")
        code = compile(tree, getattr(module.__spec__, "origin", None) or "<module>", "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in TARGETS:
            return None
        return find_spec_with_wrapped_loader(self, fullname, path, target, _Loader)


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def install() -> dict[str, Any]:
    """Apply the fix in this process (idempotent, never raises); returns ``status()``."""
    global _finder
    if not enabled():
        return status()
    try:
        with _lock:
            for name in TARGETS:
                module = sys.modules.get(name)
                if module is not None and name not in _status:
                    _patch_imported(module)
            if _finder is None or _finder not in sys.meta_path:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
    except Exception:
        logger.exception("dspark_dynamic: cudart fix failed to install")
    return status()


def status() -> dict[str, Any]:
    return {
        "enabled": enabled(),
        "finder_installed": _finder is not None and _finder in sys.meta_path,
        "modules": dict(_status),
        "pid": os.getpid(),
    }
