"""Words, sentence lengths and table-cell lengths of Markdown documents: what keeps the docs readable.

    python scripts/prose_stats.py README.md docs/*.md [--max-words 3000 --max-sentence 40 --max-cell 25]

Prints one row per file: words, median and longest sentence (in words) and the longest table cell; with
limits given, lists every sentence or cell over them and exits 1. Code blocks, inline code, URLs and link
targets are not prose and are left out; a list item or a table cell ends a sentence.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

_FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
_INLINE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\]\([^)]*\)")
_URL = re.compile(r"https?://\S+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`(\"'])")


@dataclass
class Stats:
    path: Path
    words: int = 0
    sentences: list[tuple[int, str]] = field(default_factory=list)  # (words, text)
    cells: list[tuple[int, str]] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(n for n, _ in self.sentences) if self.sentences else 0.0

    @property
    def longest(self) -> int:
        return max((n for n, _ in self.sentences), default=0)

    @property
    def longest_cell(self) -> int:
        return max((n for n, _ in self.cells), default=0)


def _words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9][\w'./+-]*", text))


def _plain(text: str) -> str:
    return _URL.sub("", _LINK.sub("]", _INLINE.sub("X", text)))


def measure(path: Path) -> Stats:
    """The prose of one Markdown file: every word outside code, its sentences, and its table cells."""
    stats = Stats(path)
    text = _FENCE.sub("", path.read_text())
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            for sentence in _SENTENCE_END.split(" ".join(paragraph)):
                n = _words(sentence)
                if n:
                    stats.sentences.append((n, sentence.strip()))
            paragraph.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("|"):
            flush()
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
                continue
            for cell in cells:
                n = _words(_plain(cell))
                stats.words += n
                stats.cells.append((n, cell))
            continue
        if not line or line.startswith(("#", "<!--", "![")) or raw.startswith("    "):
            flush()
            if line.startswith("#"):
                stats.words += _words(line)
            continue
        if re.match(r"^([-*+]|\d+\.)\s", line):
            flush()
            line = re.sub(r"^([-*+]|\d+\.)\s+", "", line)
        plain = _plain(line)
        stats.words += _words(plain)
        paragraph.append(plain)
    flush()
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--max-words", type=int)
    parser.add_argument("--max-sentence", type=int)
    parser.add_argument("--max-cell", type=int)
    args = parser.parse_args(argv)
    over: list[str] = []
    print(f"{'document':<40} {'words':>7} {'median':>7} {'longest':>8} {'cell':>5}")
    for path in args.paths:
        s = measure(path)
        print(f"{str(path):<40} {s.words:>7} {s.median:>7.0f} {s.longest:>8} {s.longest_cell:>5}")
        if args.max_words is not None and s.words > args.max_words:
            over.append(f"{path}: {s.words} words (at most {args.max_words})")
        if args.max_sentence is not None:
            over += [f"{path}: a sentence of {n} words: {t[:120]}" for n, t in s.sentences if n > args.max_sentence]
        if args.max_cell is not None:
            over += [f"{path}: a table cell of {n} words: {t[:120]}" for n, t in s.cells if n > args.max_cell]
    for line in over:
        print(line)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
