"""The pure-logic room imports neither vLLM nor torch (nor anything outside the standard library)."""

import ast
import subprocess
import sys
from pathlib import Path

import dspark_dynamic.core

CORE = Path(dspark_dynamic.core.__file__).parent
STDLIB = set(sys.stdlib_module_names)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_core_modules_import_only_the_stdlib_and_core():
    modules = sorted(CORE.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top in STDLIB or name.startswith("dspark_dynamic.core"), f"{path.name} imports {name}"


def test_importing_all_of_core_loads_no_vllm_or_torch():
    names = [f"dspark_dynamic.core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__"]
    code = (
        "import sys, importlib\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'transformers'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_core_modules_stay_small():
    """Small modules a reader can hold at once: none of ``core/`` over 400 lines."""
    long = {p.name: n for p in CORE.glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
