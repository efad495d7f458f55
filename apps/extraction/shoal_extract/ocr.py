"""OCR of a page without a text layer: pypdfium2 renders it, Tesseract reads it.

Tesseract runs inside this process through ``tesserocr`` (its wheel carries
the Tesseract 5.5 library), with the English model of Debian's
``tesseract-ocr-eng``. Where that model is missing, OCR raises
:class:`OcrUnavailable` naming the package to install, and the document ends
in a permanent error saying so: nothing crashes.

Where the CPU goes (bench/runs/2026-12-07-ocr-91e157c.md): Tesseract's line
recogniser takes about three quarters of a page, its layout analysis most of
the rest. The Tesseract program, called once a page, also loaded its model
every time (0.1-0.3 CPU-seconds) and read the page from a PNG file; an engine
kept per thread loads the model once and reads the rendered pixels as they
are.

Thread-safe: a Tesseract engine serves one page at a time, so each thread
takes an idle engine of its own (one is started when none is idle) and gives
it back after the page. Recognition releases the GIL.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

LANG = "eng"
PACKAGE = "tesseract-ocr-eng"
INSTALL_HINT = f"install Debian's {PACKAGE} (apt-get install {PACKAGE})"
# Where Debian's packages put the models (bookworm's and trixie's Tesseract 5,
# bullseye's 4). Tesseract's own TESSDATA_PREFIX, where set, is used instead.
TESSDATA_DIRS = ("/usr/share/tesseract-ocr/5/tessdata", "/usr/share/tesseract-ocr/4.00/tessdata")
# Rendering resolution. 150 dpi reads the development set's two scans (300 dpi
# bilevel images, which it halves exactly) about as well as 200 (86.7% of their
# text layers' words whole against 87.1%) for a fifth less CPU: the layout
# analysis has about half the pixels. Below 150 words go: 76.1% at 120.
OCR_DPI = 150
# Automatic page segmentation (Tesseract's mode 3): columns are found and read
# one after the other. Modes 4 and 6 (one column; one block) cost about the
# same here and read a two-column page across its columns.
PAGE_SEGMENTATION = 3


class OcrUnavailable(Exception):
    """Tesseract cannot read pages here: its English data or the tesserocr package is missing,
    or it failed on the page."""


@dataclass(frozen=True, slots=True)
class PageImage:
    """A rendered page: 8-bit grey pixels, ``stride`` bytes a row, top row first."""

    pixels: bytes
    width: int
    height: int
    stride: int
    dpi: int


def render_for_ocr(page: Any, *, dpi: int = OCR_DPI) -> PageImage:
    """One pypdfium2 page as the grey pixels Tesseract reads (the caller holds PDFium's lock)."""
    bitmap = page.render(scale=dpi / 72, grayscale=True)
    try:
        if bitmap.n_channels != 1:
            raise ValueError(f"PDFium rendered {bitmap.n_channels} channels, not 1 (greyscale)")
        return PageImage(bytes(bitmap.buffer), bitmap.width, bitmap.height, bitmap.stride, dpi)
    finally:
        bitmap.close()


def tessdata_dir() -> str:
    """The folder holding Tesseract's English model: ``$TESSDATA_PREFIX`` where set, else Debian's.

    Raises :class:`OcrUnavailable` naming the package when the model is not there.
    """
    named = os.environ.get("TESSDATA_PREFIX")  # Tesseract's own setting, honoured as it does
    for folder in (named,) if named else TESSDATA_DIRS:
        if os.path.isfile(os.path.join(folder, f"{LANG}.traineddata")):
            return folder
    where = f"TESSDATA_PREFIX={named}" if named else " or ".join(TESSDATA_DIRS)
    raise OcrUnavailable(
        f"Tesseract's English data ({LANG}.traineddata) is not in {where}: {INSTALL_HINT}"
    )


class _Engines:
    """The idle Tesseract engines of this process, per data folder.

    Written and read under ``_lock`` by every thread that OCRs; an engine taken
    is used by that thread alone until it is given back. There are never more
    engines than threads that ever OCRed at once (about 20 MB each).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[Any]] = {}

    @contextmanager
    def engine(self, datapath: str) -> Iterator[Any]:
        with self._lock:
            idle = self._idle.get(datapath)
            engine = idle.pop() if idle else None
        if engine is None:
            engine = _start_engine(datapath)
        try:
            yield engine
            engine.Clear()  # the page's results and image; the model stays loaded
        except BaseException:
            engine.End()  # in an unknown state: not given back
            raise
        with self._lock:
            self._idle.setdefault(datapath, []).append(engine)


_ENGINES = _Engines()


def _start_engine(datapath: str) -> Any:
    try:
        import tesserocr
    except ImportError as exc:
        raise OcrUnavailable(
            f"the tesserocr package is not installed ({exc}): pip install tesserocr"
        ) from None
    try:
        return tesserocr.PyTessBaseAPI(
            path=datapath, lang=LANG, oem=tesserocr.OEM.LSTM_ONLY, psm=PAGE_SEGMENTATION
        )
    except RuntimeError as exc:
        raise OcrUnavailable(
            f"Tesseract could not load {os.path.join(datapath, LANG)}.traineddata ({exc}): "
            f"{INSTALL_HINT}"
        ) from None


def read_page_image(image: PageImage) -> str:
    """The text Tesseract reads on a rendered page, paragraphs separated by blank lines."""
    with _ENGINES.engine(tessdata_dir()) as engine:
        engine.SetImageBytes(image.pixels, image.width, image.height, 1, image.stride)
        engine.SetSourceResolution(image.dpi)
        try:
            text = str(engine.GetUTF8Text())
        except RuntimeError as exc:
            raise OcrUnavailable(f"Tesseract failed ({exc})") from None
    # Tesseract ends paragraphs with blank lines already; squeeze runs of them.
    return re.sub(r"\n{3,}", "\n\n", text.replace("\x0c", "")).strip()


__all__ = [
    "INSTALL_HINT",
    "OCR_DPI",
    "PAGE_SEGMENTATION",
    "TESSDATA_DIRS",
    "OcrUnavailable",
    "PageImage",
    "read_page_image",
    "render_for_ocr",
    "tessdata_dir",
]
