"""Real text of a requested length from what the environment already holds: license texts.

Long-context benchmarks need prompts of thousands of tokens of real text, and nothing may come
from a hub.  Every installed distribution carries its license texts in its ``*.dist-info``
folder (``LICENSE*``, ``LICENCE*``, ``COPYING*``, ``NOTICE*``, or any file under
``licenses/``); this module finds them through ``importlib.metadata`` (each distribution's file
list), so it works in any environment, and builds documents from their paragraphs.

Invariants:
- Deterministic for a given environment: distributions are read in the order of their
  normalised names and versions, files in the order of their paths; identical texts (after
  line endings and surrounding whitespace are normalised) are kept once, at their first place.
- Only dist-info texts: a file outside a ``*.dist-info`` folder is never read, whatever its name.
- ``build_documents(count, n, count_tokens)`` gives ``count`` documents of at least ``n``
  tokens each, as ``count_tokens`` counts them (the target's tokenizer), and at most about one
  paragraph chunk (``CHUNK_CHARS`` characters) more.
- Different documents start at different paragraphs (spread evenly over the whole text), so
  rounds that rotate over them send different documents, and a prefix cache sees each as its own;
  a corpus shorter than a document is walked round again (the document still reaches ``n``).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["CHUNK_CHARS", "LongTextUnavailable", "build_documents", "license_files", "license_texts", "paragraphs"]

LICENSE_NAME = re.compile(r"^(licen[cs]e|copying|notice)", re.IGNORECASE)
CHUNK_CHARS = 2000  # a paragraph longer than this is cut at line (or word) boundaries


class LongTextUnavailable(RuntimeError):
    """The environment holds no license text to build documents from."""


def _is_license_file(parts: tuple[str, ...]) -> bool:
    """``parts`` (a path relative to site-packages) names a license file in a dist-info folder."""
    if len(parts) < 2 or not parts[0].endswith(".dist-info"):
        return False
    inner = parts[1:]
    return bool(LICENSE_NAME.match(inner[-1])) or (len(inner) > 1 and inner[0].lower() in ("licenses", "license_files"))


def license_files(distributions: Iterable[importlib.metadata.Distribution] | None = None) -> list[Path]:
    """The license files of ``distributions`` (default: every installed one), in a fixed order."""
    dists = list(importlib.metadata.distributions() if distributions is None else distributions)

    def key(dist: importlib.metadata.Distribution) -> tuple[str, str]:
        name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
        return name, dist.version or ""

    out: list[Path] = []
    for dist in sorted(dists, key=key):
        files = sorted((f for f in (dist.files or ()) if _is_license_file(f.parts)), key=str)
        out += [Path(str(dist.locate_file(f))) for f in files]
    return out


def _normalised(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def license_texts(distributions: Iterable[importlib.metadata.Distribution] | None = None) -> list[str]:
    """Every distinct license text, in ``license_files`` order (unreadable or empty files skipped)."""
    seen: set[str] = set()
    out: list[str] = []
    for path in license_files(distributions):
        try:
            text = _normalised(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if text and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def _chunks(paragraph: str) -> list[str]:
    """``paragraph`` cut into pieces of at most ``CHUNK_CHARS`` at line, else word, boundaries."""
    if len(paragraph) <= CHUNK_CHARS:
        return [paragraph]
    out: list[str] = []
    current = ""
    for unit in (w for line in paragraph.split("\n") for w in _split_long(line)):
        joined = f"{current}\n{unit}" if current else unit
        if len(joined) > CHUNK_CHARS and current:
            out.append(current)
            joined = unit
        current = joined
    return out + ([current] if current else [])


def _split_long(line: str) -> list[str]:
    if len(line) <= CHUNK_CHARS:
        return [line]
    out, current = [], ""
    for word in line.split(" "):
        if current and len(current) + 1 + len(word) > CHUNK_CHARS:
            out.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return out + ([current] if current else [])


def paragraphs(texts: Sequence[str]) -> list[str]:
    """The texts' paragraphs (split at blank lines, long ones cut into chunks), in order."""
    out: list[str] = []
    for text in texts:
        for para in re.split(r"\n\s*\n", _normalised(text)):
            para = para.strip()
            if para:
                out += [c.strip() for c in _chunks(para) if c.strip()]
    return out


def build_documents(count: int, min_tokens: int, count_tokens: Callable[[str], int],
                    texts: Sequence[str] | None = None, offset: float = 0.0) -> list[str]:
    """``count`` documents of at least ``min_tokens`` tokens each (``count_tokens`` of the whole
    document), paragraphs joined by blank lines; document ``j`` starts at paragraph
    ``int((j + offset) * P / count)`` of the ``P`` paragraphs of ``texts`` (default:
    ``license_texts()``): another ``offset`` (in [0, 1)) gives another set of documents."""
    if count < 1 or min_tokens < 1 or not 0.0 <= offset < 1.0:
        raise ValueError(f"count and min_tokens must be positive, offset in [0, 1); got {count}, {min_tokens}, {offset}")
    paras = paragraphs(license_texts() if texts is None else texts)
    if not paras:
        raise LongTextUnavailable("no license text found in any *.dist-info folder of this environment")
    sizes: dict[int, int] = {}
    docs: list[str] = []
    for j in range(count):
        i = int((j + offset) * len(paras) / count)
        chosen: list[str] = []
        estimate = 0
        while True:
            walked = 0
            while estimate < min_tokens:
                k = i % len(paras)
                if k not in sizes:
                    sizes[k] = count_tokens(paras[k])
                chosen.append(paras[k])
                estimate += sizes[k]
                i += 1
                walked += 1
                if walked > len(paras) and estimate == 0:
                    raise LongTextUnavailable("the license texts count as no tokens at all")
            doc = "\n\n".join(chosen)
            total = count_tokens(doc)
            if total >= min_tokens:
                docs.append(doc)
                break
            estimate = total  # joined text counts fewer than its parts: add more
    return docs
