"""Refuse JSON that Postgres cannot store, naming where it is, before anything is written.

Postgres text and jsonb cannot hold the NUL character (``\\u0000``) or a lone
UTF-16 surrogate (``"\\ud800"`` is valid JSON, but no valid UTF-8). Either
would fail deep in the driver as a server error; here it is the client's 422,
with the path of the offending string. Nesting is bounded too: a document
nested thousands deep exhausts the recursion of the JSON encoder on its way to
the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from shoal.errors import InvalidInput

# Deeper than any real payload; far below the encoder's recursion limit.
MAX_DEPTH = 64


def _problem(text: str) -> str | None:
    if "\x00" in text:
        return "strings may not contain NUL characters (\\u0000): Postgres cannot store them"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "strings must be valid Unicode (a lone surrogate such as \\ud800 is not)"
    return None


def check_storable(value: Any, field: str) -> None:
    """Raise :class:`InvalidInput` naming the first string (or key) Postgres would refuse.

    >>> check_storable({"a": ["ok", "bad\\x00"]}, "params")
    Traceback (most recent call last):
    ...
    shoal.errors.InvalidInput: params.a[1]: strings may not contain NUL characters ...
    """
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        current, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidInput(path, f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(current, str):
            problem = _problem(current)
            if problem is not None:
                raise InvalidInput(path, problem)
        elif isinstance(current, Mapping):
            children = []
            for key, item in current.items():
                key_text = str(key)
                problem = _problem(key_text)
                if problem is not None:
                    raise InvalidInput(f"{path} (a key)", problem)
                children.append((item, f"{path}.{key_text}", depth + 1))
            stack.extend(reversed(children))  # popped in document order
        elif isinstance(current, list | tuple):
            stack.extend(
                (item, f"{path}[{i}]", depth + 1) for i, item in reversed(list(enumerate(current)))
            )


def refuse_unstorable_params(request: Request) -> None:
    """A route dependency: 422 for a query or path parameter Postgres could not compare.

    A NUL in ``?q=`` reached the database as a text parameter and failed there
    as a server error (found by the API fuzz test); every parameter of every
    route is checked here, once, before any route reads it.
    """
    params = [*request.query_params.multi_items(), *request.path_params.items()]
    for name, value in params:
        problem = _problem(str(value))
        if problem is not None:
            raise InvalidInput(name, problem)


__all__ = ["MAX_DEPTH", "check_storable", "refuse_unstorable_params"]
