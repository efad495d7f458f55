"""OCR of a page without a text layer: pypdfium2 renders it, Tesseract reads it.

Tesseract is a system program (Debian's ``tesseract-ocr`` with the English
data, ``tesseract-ocr-eng``), called through ``pytesseract``. Where it is
missing, OCR raises :class:`OcrUnavailable` naming the packages to install,
and the document ends in a permanent error saying so: nothing crashes.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytesseract

# Rendering resolution: body text of 9-10 pt reads reliably from 200 dpi up.
OCR_DPI = 200
# Tesseract runs OpenMP threads by default; a worker OCRs several pages at once
# and the threads of those processes fight over the cores: one page takes 4-5
# times as long here as with one thread each. The tesseract processes inherit
# this; an operator's own setting wins.
os.environ.setdefault("OMP_THREAD_LIMIT", "1")
TESSERACT_CONFIG = ""
PACKAGES = "tesseract-ocr tesseract-ocr-eng"
INSTALL_HINT = f"install Debian's {PACKAGES} (apt-get install {PACKAGES})"


class OcrUnavailable(Exception):
    """Tesseract (or its English data) is not installed on this machine."""


def render_for_ocr(page: Any, *, dpi: int = OCR_DPI) -> Any:
    """One pypdfium2 page as the greyscale PIL image Tesseract reads."""
    return page.render(scale=dpi / 72, grayscale=True).to_pil()


def ocr_page(page: Any, *, lang: str = "eng") -> str:
    """The text Tesseract reads on one pypdfium2 page, paragraphs separated by blank lines."""
    image = render_for_ocr(page)
    try:
        text = str(pytesseract.image_to_string(image, lang=lang, config=TESSERACT_CONFIG))
    except pytesseract.TesseractNotFoundError:
        raise OcrUnavailable(f"Tesseract is not installed: {INSTALL_HINT}") from None
    except pytesseract.TesseractError as exc:
        raise OcrUnavailable(f"Tesseract failed ({exc.message.strip()}): {INSTALL_HINT}") from None
    # Tesseract ends paragraphs with blank lines already; squeeze runs of them.
    return re.sub(r"\n{3,}", "\n\n", text.replace("\x0c", "")).strip()


__all__ = [
    "INSTALL_HINT",
    "OCR_DPI",
    "TESSERACT_CONFIG",
    "OcrUnavailable",
    "ocr_page",
    "render_for_ocr",
]
