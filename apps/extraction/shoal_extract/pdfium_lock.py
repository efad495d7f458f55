"""The one lock every use of PDFium in this process goes under.

pypdfium2 is not thread-safe: two threads in PDFium at once (the worker
parsing in threads while the API renders a page, say) can crash the process.
The parse, the front-page signals and the page view each used a lock of
their own, which kept them apart from themselves only; they share this one.
"""

from __future__ import annotations

import threading

# Re-entrant: a caller already holding it (a parse reading the signals, say)
# takes it again without waiting for itself.
PDFIUM = threading.RLock()

__all__ = ["PDFIUM"]
