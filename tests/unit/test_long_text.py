"""The long-context benchmarks' text: license texts of the environment's dist-info folders only,
deduplicated, in a fixed order, built into documents of at least a requested length (no engine)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from dspark_lab.long_text import CHUNK_CHARS, build_documents, license_files, license_texts, paragraphs

MIT = "Permission is hereby granted, free of charge, to any person.\n\nThe above copyright notice shall be included."


def words(text: str) -> int:
    return len(text.split())


def make_dist(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    """A distribution in ``site``: its dist-info with METADATA and a RECORD listing ``files``
    (paths relative to ``site``, written with their text)."""
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", **files}
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (site / info / "RECORD").write_text("".join(f"{rel},,\n" for rel in [*files, f"{info}/RECORD"]))


@pytest.fixture
def site(tmp_path):
    make_dist(tmp_path, "zeta_pkg", "2.0", {
        "zeta_pkg-2.0.dist-info/COPYING": "Zeta copying terms.\n\nSecond zeta paragraph.",
        "zeta_pkg-2.0.dist-info/LICENSE": MIT + "\r\n",  # the same text as alpha's, other line ending
    })
    make_dist(tmp_path, "Alpha-Pkg", "1.0", {
        "Alpha_Pkg-1.0.dist-info/LICENSE": MIT,
        "Alpha_Pkg-1.0.dist-info/licenses/vendored/NOTICE.txt": "Alpha notice.",
        "Alpha_Pkg-1.0.dist-info/entry_points.txt": "[console_scripts]\nlicense = x:y\n",
        "alpha_pkg/LICENSE": "A license inside the package, not its dist-info: never read.",
        "alpha_pkg/licenses/GPL.txt": "Nor this one.",
    })
    return tmp_path


def dists(site: Path) -> list[importlib.metadata.Distribution]:
    return list(importlib.metadata.distributions(path=[str(site)]))


def test_only_license_files_of_dist_info_folders_in_a_fixed_order(site):
    found = [p.relative_to(site).as_posix() for p in license_files(dists(site))]
    assert found == [  # alpha before zeta (normalised names), paths sorted within one
        "Alpha_Pkg-1.0.dist-info/LICENSE",
        "Alpha_Pkg-1.0.dist-info/licenses/vendored/NOTICE.txt",
        "zeta_pkg-2.0.dist-info/COPYING",
        "zeta_pkg-2.0.dist-info/LICENSE",
    ]
    assert license_files(list(reversed(dists(site)))) == license_files(dists(site))


def test_identical_texts_are_kept_once(site):
    texts = license_texts(dists(site))
    assert texts == [MIT, "Alpha notice.", "Zeta copying terms.\n\nSecond zeta paragraph."]
    assert not any("package" in t or "Nor this" in t for t in texts)


def test_documents_reach_the_length_are_deterministic_and_differ(site):
    texts = license_texts(dists(site))
    docs = build_documents(3, 40, words, texts)  # the corpus holds 28 words: walked round again
    assert len(docs) == 3 and all(words(d) >= 40 for d in docs)
    assert build_documents(3, 40, words, texts) == docs
    assert len({d.split("\n\n")[0] for d in docs}) == 3  # each starts at its own paragraph
    assert build_documents(3, 40, words, texts, offset=0.5) != docs
    with pytest.raises(ValueError):
        build_documents(0, 40, words, texts)


def test_a_document_overshoots_by_at_most_a_chunk():
    long_line = " ".join(f"w{i}" for i in range(3000))  # one paragraph of ~17k characters, no newline
    paras = paragraphs([long_line])
    assert len(paras) > 1 and all(len(p) <= CHUNK_CHARS for p in paras)
    assert " ".join(paras).split() == long_line.split()  # nothing lost or reordered
    doc = build_documents(1, 100, words, [long_line])[0]
    assert 100 <= words(doc) <= 100 + CHUNK_CHARS // 2


def test_this_environment_holds_enough_license_text_for_a_long_document():
    files = license_files()
    assert files and all(any(part.endswith(".dist-info") for part in p.parts) for p in files)
    docs = build_documents(3, 4096, words)
    assert all(words(d) >= 4096 for d in docs) and len(set(docs)) == 3
