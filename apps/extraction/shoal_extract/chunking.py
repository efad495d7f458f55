"""A long paper cut into chunks, and the chunks most likely to hold each field.

Chunks respect the structure the parser kept: a chunk never spans two pages,
page furniture (running headers and footers, page numbers, stamps) is left out,
a heading (``#``/``##``) starts a new chunk, and paragraphs are not cut
unless one alone is longer than a chunk. Each chunk knows its page and the
section it is in.

For a field, chunks are ranked by BM25 (the ``bm25s`` library: a cheap
lexical score, no embedding model) against a query made of the field's name,
its description and a few words papers use for it. :func:`select` then fills
a token budget for one model call round-robin over the fields, each field's
best chunk not yet taken in turn, so every field gets its likeliest text
before any field gets its second; the front matter (the leading chunks up to
500 tokens: title, authors, usually the abstract) is always in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import bm25s

from shoal_extract.parsing import ParsedText
from shoal_extract.templates import Field

# About 400 tokens: a section's paragraph or two, small enough that the budget
# of one call holds the best chunks of every field.
CHUNK_CHARS = 1600
# The front matter every call shows (title, authors, abstract): bibliographic
# fields live there, and the model needs to know which paper it reads.
FRONT_TOKENS = 500
CHARS_PER_TOKEN = 4  # an estimate for English prose; the budget is approximate by design
_HEADING = re.compile(r"^#{1,6}\s+(.+)$")
_TOKEN = re.compile(r"[^\W_]+")
STOPWORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in", "is",
     "it", "its", "of", "on", "or", "that", "the", "their", "this", "to", "was", "were", "which",
     "with", "what", "who", "whom")
)  # fmt: skip
# Words papers use for the shipped templates' fields, beyond their descriptions.
FIELD_HINTS: Mapping[str, str] = {
    "title": "title",
    "authors": "authors names affiliations department university",
    "year": "published received accepted copyright year",
    "journal": "journal volume issue published",
    "doi": "doi https org",
    "sample_size": "randomized randomised randomly assigned enrolled participants patients total "
    "screened allocated n",
    "intervention": "randomly assigned receive intervention group treatment versus",
    "comparator": "control placebo usual care versus comparator group",
    "primary_outcome": "primary outcome end point endpoint measured",
    "conclusion": "conclusions interpretation conclusion improved did not",
}


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    page: int
    section: str | None
    start: int  # offset in the document's text
    text: str

    @property
    def tokens(self) -> int:
        """Its cost in a prompt, label included (an estimate: characters / 4)."""
        return (len(self.label()) + len(self.text) + 2) // CHARS_PER_TOKEN + 1

    def label(self) -> str:
        section = f', section "{self.section}"' if self.section else ""
        return f"[chunk {self.index + 1}, page {self.page}{section}]"


def chunk_document(document: ParsedText, *, max_chars: int = CHUNK_CHARS) -> list[Chunk]:
    """The document's chunks in reading order."""
    chunks: list[Chunk] = []
    section: str | None = None
    spans: list[tuple[int, int]] = []  # (start, end) in the text: the paragraphs gathered

    def close(page: int) -> None:
        if spans:
            start, end = spans[0][0], spans[-1][1]
            chunks.append(Chunk(len(chunks), page, section, start, document.text[start:end]))
            spans.clear()

    for number in range(1, document.pages + 1):
        base = document.page_starts[number - 1]
        for match in re.finditer(r"[^\n]+(?:\n[^\n]+)*", document.page_text(number)):
            paragraph, offset = match.group(0), base + match.start()
            if document.is_furniture(offset, offset + len(paragraph)):
                continue  # a running header, a page number, a stamp: not the paper's text
            heading = _HEADING.match(paragraph)
            if heading:
                # A heading starts a chunk, unless the chunk so far is headings only.
                if any(not _HEADING.match(document.text[a:b]) for a, b in spans):
                    close(number)
                section = heading.group(1).strip()
            if spans and offset + len(paragraph) - spans[0][0] > max_chars:
                close(number)
            if len(paragraph) <= max_chars:
                spans.append((offset, offset + len(paragraph)))
                continue
            for piece_start, piece in _pieces(paragraph, max_chars):
                spans.append((offset + piece_start, offset + piece_start + len(piece)))
                close(number)
        close(number)  # a chunk never spans two pages
    return chunks


def front_matter(chunks: Sequence[Chunk], *, tokens: int = FRONT_TOKENS) -> list[Chunk]:
    """The leading chunks (at least one) within ``tokens``: title, authors, often the abstract."""
    front: list[Chunk] = []
    for chunk in chunks:
        if front and sum(c.tokens for c in front) + chunk.tokens > tokens:
            break
        front.append(chunk)
    return front


def _pieces(paragraph: str, max_chars: int) -> list[tuple[int, str]]:
    """A paragraph longer than a chunk, cut after sentences (or hard, failing that)."""
    pieces: list[tuple[int, str]] = []
    start = 0
    while start < len(paragraph):
        end = min(start + max_chars, len(paragraph))
        if end < len(paragraph):
            cut = paragraph.rfind(". ", start, end)
            end = cut + 1 if cut > start else end
        pieces.append((start, paragraph[start:end]))
        start = end
        while start < len(paragraph) and paragraph[start].isspace():
            start += 1
    return pieces


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.casefold()) if t not in STOPWORDS]


def field_query(field: Field) -> list[str]:
    words = f"{field.name.replace('_', ' ')} {field.description} {FIELD_HINTS.get(field.name, '')}"
    return list(dict.fromkeys(tokenize(words)))


class ChunkIndex:
    """BM25 over one document's chunks."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.chunks = list(chunks)
        self._bm25 = bm25s.BM25()
        # bm25s wants at least one token per document; an empty chunk scores zero anyway.
        self._bm25.index([tokenize(c.text) or ["\u2205"] for c in self.chunks], show_progress=False)

    def ranked(self, field: Field) -> list[Chunk]:
        """The chunks that share a word with the field's query, best first."""
        scores = self._bm25.get_scores(field_query(field))
        order = sorted(range(len(self.chunks)), key=lambda i: (-float(scores[i]), i))
        return [self.chunks[i] for i in order if float(scores[i]) > 0]


def select(
    ranked: Mapping[str, Sequence[Chunk]],
    budget_tokens: int,
    *,
    always: Sequence[Chunk] = (),
    exclude: frozenset[int] = frozenset(),
) -> list[Chunk]:
    """Chunks for one call within ``budget_tokens``, in document order.

    ``always`` go in first (when they fit); then each field's best chunk not
    yet chosen nor in ``exclude``, round-robin over the fields, until the
    budget is spent or no field has a chunk left.
    """
    chosen: dict[int, Chunk] = {}
    spent = 0
    for chunk in always:
        if spent + chunk.tokens <= budget_tokens:
            chosen[chunk.index] = chunk
            spent += chunk.tokens
    queues = {
        name: [c for c in chunks if c.index not in exclude] for name, chunks in ranked.items()
    }
    progress = True
    while progress:
        progress = False
        for queue in queues.values():
            while queue and queue[0].index in chosen:
                queue.pop(0)
            if not queue:
                continue
            chunk = queue.pop(0)
            progress = True  # a chunk left a queue: the loop ends when all are empty
            if spent + chunk.tokens > budget_tokens:
                continue  # too big for what is left; a smaller one may fit
            chosen[chunk.index] = chunk
            spent += chunk.tokens
    return sorted(chosen.values(), key=lambda c: c.index)


__all__ = [
    "CHUNK_CHARS",
    "Chunk",
    "ChunkIndex",
    "chunk_document",
    "field_query",
    "front_matter",
    "select",
]
