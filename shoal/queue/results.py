"""A handler's result as the JSON text a row stores, or why it cannot be stored.

Job outputs and item results are ``jsonb``. A value that is not JSON (a
``datetime``, a set, an object), or JSON that PostgreSQL refuses (NaN, a NUL
character in a string, text that is not UTF-8), must fail the run that
returned it, at once and naming where in the value it sits, rather than the
statement that records a whole batch of outcomes (which strands every job in
it until its lease runs out). Workers encode each result as the run ends, so
the completer sends text that cannot fail to load.

>>> encode_result({"n": 1})
'{"n":1}'
>>> encode_result({"at": [1, {2}]})
Traceback (most recent call last):
...
shoal.errors.UnstorableResult: result["at"][1]: set is not JSON serializable
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from shoal.errors import UnstorableResult

# Built once: json.dumps with any non-default option builds an encoder per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
# A \u0000 escape (not an escaped backslash followed by "u0000"): jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_KEY_TYPES = (str, int, float, bool, type(None))


def encode_result(value: object, *, returned_by: str = "") -> str | None:
    """``value`` as JSON text for a ``jsonb`` column (None for None).

    Raises :class:`UnstorableResult` naming the first value that cannot be
    stored, prefixed by ``returned_by`` (e.g. ``'handler app.export of queue
    "reports" returned a result that cannot be stored: '``).
    """
    if value is None:
        return None
    try:
        text = _ENCODER.encode(value)
        if not text.isascii():
            text.encode("utf-8")  # a lone surrogate is not UTF-8
    except (TypeError, ValueError, RecursionError):
        raise UnstorableResult(returned_by + _first_bad(value, "result", set())) from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise UnstorableResult(returned_by + _first_bad(value, "result", set()))
    return text


def callable_name(fn: object) -> str:
    """A handler's name for messages: ``module.qualname``, as far as it has them."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module != "builtins" else name


def returned_by(handler: str, where: str) -> str:
    """The prefix of a run's error whose result cannot be stored.

    >>> returned_by("app.export", "queue 'reports'")
    "handler app.export of queue 'reports' returned a result that cannot be stored: "
    """
    return f"handler {handler} of {where} returned a result that cannot be stored: "


def _first_bad(value: object, path: str, seen: set[int]) -> str:
    """Where in ``value`` the first unstorable part is, and why."""
    if isinstance(value, str):
        return _bad_text(value, path) or f"{path}: cannot be stored"
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return f"{path}: cannot be stored"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return f"{path}: float {value!r} is not allowed in JSON"
        return f"{path}: cannot be stored"
    if isinstance(value, dict | list | tuple):
        if id(value) in seen:
            return f"{path}: refers to itself (a circular reference)"
        if len(seen) >= 200:
            return f"{path}: nested too deeply"
        seen.add(id(value))
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, _KEY_TYPES):
                    return f"{path}: key {key!r} ({type(key).__name__}) is not a JSON object key"
                if isinstance(key, str) and (bad := _bad_text(key, f"{path} key {key!r}")):
                    return bad
                if not _storable(item):
                    return _first_bad(item, f"{path}[{json.dumps(key)}]", seen)
        else:
            for index, item in enumerate(value):
                if not _storable(item):
                    return _first_bad(item, f"{path}[{index}]", seen)
        seen.discard(id(value))
        return f"{path}: cannot be stored"
    return f"{path}: {type(value).__name__} is not JSON serializable"


def _storable(value: Any) -> bool:
    try:
        text = _ENCODER.encode(value)
        if not text.isascii():
            text.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return False
    return not ("\\u0000" in text and _JSON_NUL.search(text))


def _bad_text(text: str, path: str) -> str | None:
    if "\x00" in text:
        return f"{path}: str holds a NUL character, which PostgreSQL's jsonb cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{path}: str holds a lone surrogate, which is not UTF-8"
    return None
