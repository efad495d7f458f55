"""How faithfully the parse reads real papers: whole words, reading order, furniture, OCR cost.

    .venv/bin/python -m bench.parse_bench                    # every paper of the development set
    .venv/bin/python -m bench.parse_bench --papers DIR --only heart_vos1998
    .venv/bin/python -m bench.parse_bench --ocr               # OCR settings, CPU-seconds a page

The development set (32 real papers, not openly licensed) lives outside the
repository: ``$SHOAL_PAPERS_DIR``, or ``shared/corpus/papers`` in a parent of
the repository root. The bench prints figures only, never the papers' text.

**Words whole.** The reference is an independent extraction of the same page:
PDFium's text layer (pypdfium2's ``get_text_range``), which places spaces by
its own rules. Both texts are reduced the same way: Unicode NFKC (ligatures
become letters), a hyphen at a line's end before a lower-case letter joined to
the next line, split on white space, and each token keyed by its letters and
digits alone, case-folded (``"Etzioni,"`` is ``etzioni``; tokens with neither
are dropped). A reference word is *whole* when the parse has a token with the
same key; counted as multisets (a word printed 5 times needs 5 tokens). The
share is over all text-layer pages of a paper, Markdown markup and the
furniture marks included (furniture is kept in the text, only marked). A glued
pair (``DougDowney``) counts as two words lost; a word split in two counts as
one lost.

**Reading order.** Word trigrams of the reference (in PDFium's order, which
follows the content stream, within each of its lines and across line ends)
that the parse also has, as a share. Where a two-column page is read across
the columns, every line end breaks two trigrams. A page whose share is below
``ORDER_FLAG`` is listed as *order differs*: the parse mixes columns there, or
PDFium's own order is not the reading order (a publisher that writes the
page's blocks out of order); look at the page to tell.

**Furniture.** Lines the parse marks as page furniture (running headers and
footers, page numbers, stamps, rotated margin lines): the count per paper.

**OCR** (``--ocr``): the two scans' pages rendered and read by Tesseract as
a scan would be, for each engine (the Tesseract program or the library in
this process) / DPI / page segmentation mode / option setting, with the text
layer set aside: CPU-seconds a page (ours, rendering included, and the
Tesseract program's), the share of the text layer's words the OCR text holds
whole, and its reading order (word trigrams, as above: a page read across
its two columns loses most). ``--ocr-pages N`` takes the first N pages of each scan (14 takes
all 18), ``--ocr-reps`` runs the settings in turn that many times.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pypdfium2

from shoal_extract.parsing import DocumentFormat, ParsedText, parse_document

ROOT = Path(__file__).resolve().parents[1]
TARGET_WHOLE = 0.98
ORDER_FLAG = 0.90
_LINE_HYPHEN = re.compile(r"(\w)[-\u00ad\u2010\x02]\s*\n\s*(?=[a-z])")
_KEY = re.compile(r"[\W_]+")


def papers_dir(explicit: str | None = None) -> Path | None:
    """The development set (a folder holding ``pdfs/``): ``explicit``, ``$SHOAL_PAPERS_DIR``,
    or ``shared/corpus/papers`` in a parent of the repository root; None when absent."""
    named = explicit or os.environ.get("SHOAL_PAPERS_DIR")
    if named:
        return Path(named) if (Path(named) / "pdfs").is_dir() else None
    for parent in ROOT.parents:
        candidate = parent / "shared" / "corpus" / "papers"
        if (candidate / "pdfs").is_dir():
            return candidate
    return None


def keys(text: str) -> list[str]:
    """The text's words as the bench compares them (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _LINE_HYPHEN.sub(r"\1", text)
    out = []
    for token in text.split():
        key = _KEY.sub("", token).casefold()
        if key:
            out.append(key)
    return out


def reference_pages(content: bytes) -> list[str]:
    """PDFium's text of every page."""
    pdf = pypdfium2.PdfDocument(content)
    try:
        texts = []
        for index in range(len(pdf)):
            page = pdf[index]
            textpage = page.get_textpage()
            texts.append(textpage.get_text_range())
            textpage.close()
            page.close()
        return texts
    finally:
        pdf.close()


def whole_share(reference: list[str], parsed: list[str]) -> tuple[int, int]:
    """(reference words found whole in the parse, reference words)."""
    ref, got = Counter(reference), Counter(parsed)
    return sum(min(n, got[w]) for w, n in ref.items()), sum(ref.values())


def trigram_share(reference: list[str], parsed: list[str]) -> tuple[int, int]:
    def grams(words: list[str]) -> Counter[tuple[str, str, str]]:
        return Counter(zip(words, words[1:], words[2:], strict=False))

    ref, got = grams(reference), grams(parsed)
    return sum(min(n, got[g]) for g, n in ref.items()), sum(ref.values())


@dataclass(frozen=True, slots=True)
class PaperFigures:
    name: str
    pages: int
    ocr_pages: int
    words: int
    whole: float
    order: float
    order_pages: tuple[int, ...]  # 1-based pages whose order share is under ORDER_FLAG
    furniture: int
    seconds: float


def measure(path: Path, parsed: ParsedText | None = None) -> PaperFigures:
    """One paper's figures; ``parsed`` is its parse when already made (CPU s then 0)."""
    content = path.read_bytes()
    started = time.process_time()
    if parsed is None:
        parsed = parse_document(content, DocumentFormat.PDF)
    seconds = time.process_time() - started
    reference = reference_pages(content)
    found = total = o_found = o_total = 0
    flagged = []
    for number in range(1, parsed.pages + 1):
        if number in parsed.ocr_pages:
            continue
        page_text = parsed.page_text(number)
        ref, got = keys(reference[number - 1]), keys(page_text)
        f, t = whole_share(ref, got)
        found, total = found + f, total + t
        of, ot = trigram_share(ref, got)
        o_found, o_total = o_found + of, o_total + ot
        if ot >= 30 and of / ot < ORDER_FLAG:
            flagged.append(number)
    furniture = len(parsed.furniture)
    return PaperFigures(
        name=path.stem,
        pages=parsed.pages,
        ocr_pages=len(parsed.ocr_pages),
        words=total,
        whole=found / total if total else 1.0,
        order=o_found / o_total if o_total else 1.0,
        order_pages=tuple(flagged),
        furniture=furniture,
        seconds=seconds,
    )


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def parse_table(rows: list[PaperFigures]) -> list[str]:
    out = [
        "| paper | pages | OCR | words | whole | order | order differs on pages | furniture "
        "| CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pages = ", ".join(map(str, r.order_pages)) or "-"
        out.append(
            f"| {r.name} | {r.pages} | {r.ocr_pages} | {r.words} | {r.whole:.1%} | {r.order:.1%} "
            f"| {pages} | {r.furniture} | {r.seconds:.1f} |"
        )
    shares = [r.whole for r in rows if r.words]
    below = [r.name for r in rows if r.words and r.whole < TARGET_WHOLE]
    mixed = [r.name for r in rows if r.order_pages]
    out += [
        "",
        f"Words whole: min {min(shares):.1%}, median {statistics.median(shares):.1%}; "
        f"under {TARGET_WHOLE:.0%}: {', '.join(below) or 'none'}.",
        f"Order differs from PDFium's on some page: {len(mixed)} papers "
        f"({', '.join(mixed) or 'none'}).",
        f"Parse CPU: {sum(r.seconds for r in rows):.1f} s for {sum(r.pages for r in rows)} pages.",
    ]
    return out


# --- OCR ---------------------------------------------------------------------------------

# (engine, dpi, psm, options). Engines: "program" is the Tesseract program run
# once a page on a PNG (what shoal_extract.ocr did up to 944515e, through
# pytesseract), "program/paper" the program run once a paper on a list of the
# paper's pages, "tesserocr" Tesseract 5.5 in this process through tesserocr,
# one engine kept for all pages; "shoal" is shoal_extract.ocr as it is.
# Options are Tesseract variables, name=value.
OCR_SETTINGS: list[tuple[str, int, int, str]] = [
    ("program", 200, 3, ""),
    ("program/paper", 200, 3, ""),
    ("tesserocr", 200, 3, ""),
    ("tesserocr", 200, 3, "invert_threshold=0"),
    ("tesserocr", 200, 3, "load_system_dawg=0 load_freq_dawg=0"),
    ("tesserocr", 200, 6, ""),
    ("tesserocr", 175, 3, ""),
    ("tesserocr", 150, 3, ""),
    ("tesserocr", 150, 4, ""),
    ("tesserocr", 120, 3, ""),
    ("shoal", 0, 0, ""),
]
OCR_PAPERS = ("clincardiol_mattioli1998", "jcompphys_jordan1986")


def _cpu() -> float:
    """CPU-seconds of this process and of its finished children (the Tesseract program)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _grey_image(image: Any) -> Any:
    from PIL import Image

    return Image.frombuffer(
        "L", (image.width, image.height), image.pixels, "raw", "L", image.stride, 1
    )


def _run_program(images: list[Any], workdir: Path, psm: int, options: str) -> list[str]:
    """The Tesseract program on the pages: one call for all of them (a list file of PNMs),
    or one call on a PNG for one page (as pytesseract does)."""
    config = [arg for o in options.split() for arg in ("-c", o)]
    if len(images) == 1:
        source = workdir / "page.png"
        _grey_image(images[0]).save(source)
    else:
        names = []
        for n, image in enumerate(images):
            names.append(str(workdir / f"page-{n}.pnm"))
            _grey_image(image).save(names[-1])
        source = workdir / "pages.txt"
        source.write_text("\n".join(names) + "\n")
    out = subprocess.run(
        ["tesseract", str(source), "-", "--psm", str(psm), *config],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_THREAD_LIMIT": "1"},  # one thread, as the app ran it
    )
    return out.stdout.split("\x0c")[: len(images)]


def _start_tesserocr(psm: int, options: str) -> Any:
    import tesserocr

    from shoal_extract.ocr import LANG, tessdata_dir

    variables = dict(o.split("=", 1) for o in options.split())
    init = {k: v for k, v in variables.items() if k.startswith("load_")}  # read at start only
    engine = tesserocr.PyTessBaseAPI(
        path=tessdata_dir(), lang=LANG, oem=tesserocr.OEM.LSTM_ONLY, psm=psm, variables=init
    )
    for name, value in variables.items():
        if name not in init and not engine.SetVariable(name, value):
            raise ValueError(f"Tesseract has no variable {name!r}")
    return engine


def _ocr_papers(
    setting: tuple[str, int, int, str], papers: list[tuple[Any, list[list[str]]]], engine: Any
) -> tuple[float, float, float]:
    """(CPU-seconds, words whole, order) for one setting: shares of the text layers' words
    and word trigrams that the OCR text has."""
    from shoal_extract.ocr import read_page_image, render_for_ocr

    kind, dpi, psm, options = setting
    cpu = 0.0
    texts: list[tuple[str, list[str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for pdf, references in papers:
            before = _cpu()
            images = [
                render_for_ocr(pdf[n], **({"dpi": dpi} if dpi else {}))
                for n in range(len(references))
            ]
            if kind == "program":
                got = [_run_program([image], Path(tmp), psm, options)[0] for image in images]
            elif kind == "program/paper":
                got = _run_program(images, Path(tmp), psm, options)
            elif kind == "tesserocr":
                got = []
                for image in images:
                    engine.SetImageBytes(image.pixels, image.width, image.height, 1, image.stride)
                    engine.SetSourceResolution(image.dpi)
                    got.append(engine.GetUTF8Text())
            else:
                got = [read_page_image(image) for image in images]
            cpu += _cpu() - before
            texts += zip(got, references, strict=True)
    found = total = o_found = o_total = 0
    for text, reference in texts:
        f, t = whole_share(reference, keys(text))
        found, total = found + f, total + t
        f, t = trigram_share(reference, keys(text))
        o_found, o_total = o_found + f, o_total + t
    return cpu, found / total, o_found / o_total


def ocr_rows(directory: Path, pages_each: int, reps: int) -> list[str]:
    """Each setting over the first ``pages_each`` pages of each scan, ``reps`` times in turn."""
    from shoal_extract.ocr import OCR_DPI, PAGE_SEGMENTATION, PageImage, read_page_image

    papers = []
    for stem in OCR_PAPERS:
        content = (directory / "pdfs" / f"{stem}.pdf").read_bytes()
        reference = reference_pages(content)
        pdf = pypdfium2.PdfDocument(content)
        papers.append((pdf, [keys(text) for text in reference[:pages_each]]))
    pages = sum(len(references) for _, references in papers)
    started = _cpu()
    read_page_image(PageImage(b"\xff" * 64, 8, 8, 8, OCR_DPI))  # starts shoal's engine
    start_cpu = _cpu() - started
    engines = {}
    for setting in OCR_SETTINGS:
        kind, _, psm, options = setting
        if kind == "tesserocr":
            engines[setting] = _start_tesserocr(psm, options)
    seconds: dict[tuple[str, int, int, str], list[float]] = {s: [] for s in OCR_SETTINGS}
    shares: dict[tuple[str, int, int, str], tuple[float, float]] = {}
    for _ in range(reps):  # in turn, so a change in the machine's load falls on every setting
        for setting in OCR_SETTINGS:
            cpu, whole, order = _ocr_papers(setting, papers, engines.get(setting))
            seconds[setting].append(cpu / pages)
            shares[setting] = whole, order
            print(
                f"{setting}: {cpu / pages:.2f} CPU-s a page, {whole:.1%}, {order:.1%}", flush=True
            )
    rows = [
        f"| engine | DPI | psm | options | pages | CPU s a page, median of {reps} (range) "
        "| words whole | order |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setting in OCR_SETTINGS:
        kind, dpi, psm, options = setting
        if kind == "shoal":
            dpi, psm = OCR_DPI, PAGE_SEGMENTATION
        s = seconds[setting]
        rows.append(
            f"| {kind} | {dpi} | {psm} | {options or '-'} | {pages} | {statistics.median(s):.2f} "
            f"({min(s):.2f}-{max(s):.2f}) | {shares[setting][0]:.1%} | {shares[setting][1]:.1%} |"
        )
    import tesserocr

    program = subprocess.run(["tesseract", "--version"], capture_output=True, text=True)
    rows += [
        "",
        f"The program: {program.stdout.split(chr(10))[0]}; tesserocr {tesserocr.__version__} with "
        f"{tesserocr.tesseract_version().split(chr(10))[0]}; Debian's eng model.",
        f"Starting shoal's engine (once a thread, loading the model): {start_cpu:.2f} CPU-s. "
        f"Load average at the end: {', '.join(f'{n:.1f}' for n in os.getloadavg())}.",
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--papers", help="the development set's folder (holds pdfs/)")
    parser.add_argument("--only", action="append", help="a paper's file stem; repeatable")
    parser.add_argument("--ocr", action="store_true", help="time OCR settings instead")
    parser.add_argument("--ocr-pages", type=int, default=4, help="pages of each scan to OCR")
    parser.add_argument("--ocr-reps", type=int, default=3, help="times each OCR setting runs")
    parser.add_argument("--record", action="store_true", help="write bench/runs/<date>-parse-*.md")
    args = parser.parse_args(argv)
    commit = _commit()  # the code measured, before anything is edited during the run
    directory = papers_dir(args.papers)
    if directory is None:
        print("no development set (a folder with pdfs/): set SHOAL_PAPERS_DIR or --papers")
        return 2
    if args.ocr:
        lines = ocr_rows(directory, args.ocr_pages, args.ocr_reps)
        kind = "ocr"
    else:
        rows = []
        for path in sorted((directory / "pdfs").glob("*.pdf")):
            if args.only and path.stem not in args.only:
                continue
            rows.append(measure(path))
            print(parse_table([rows[-1]])[2], flush=True)
        lines = parse_table(rows)
        kind = "parse"
    print("\n".join(lines))
    if args.record:
        day = datetime.now(UTC).date().isoformat()
        out = ROOT / "bench" / "runs" / f"{day}-{kind}-{commit}.md"
        out.parent.mkdir(exist_ok=True)
        head = [
            f"# {kind} bench, {day}, commit {commit}",
            "",
            f"`python -m bench.parse_bench {' '.join(argv if argv is not None else sys.argv[1:])}` "
            "on the development set "
            f"({os.cpu_count()} cores, Python {sys.version.split()[0]}). Figures only.",
            "",
        ]
        out.write_text("\n".join(head + lines) + "\n")
        print(f"recorded: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
