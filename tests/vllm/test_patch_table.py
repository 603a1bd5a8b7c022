"""The patch table is printed from the registered patches, and docs/patches.md shows that print."""

from pathlib import Path

from dspark_dynamic.adapter.patches.check import main, table
from dspark_dynamic.adapter.plugin import all_patches

DOC = Path(__file__).resolve().parents[2] / "docs" / "patches.md"
MARK = "<!-- table: generated -->\n"


def test_every_patch_carries_its_row():
    for patch in all_patches():
        assert patch.why and patch.process and patch.removable_when, patch.name
        assert patch.where and patch.where.fork and patch.where.v032 and patch.where.v033, patch.name


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
