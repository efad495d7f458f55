"""Host names as the API's ``Host`` check sees them, apart from any web framework
so the command line can check ``--allowed-host`` before it imports one.

>>> host_name("[::1]:8000"), host_port("[::1]:8000")
('::1', 8000)
"""

from __future__ import annotations

from collections.abc import Iterable

from shoal.errors import InvalidInput

# Extra names `shoal api` answers to, comma-separated (or --allowed-host, repeated).
ALLOWED_HOSTS_ENV = "SHOAL_API_ALLOWED_HOSTS"


def host_name(value: str) -> str:
    """The name part of a ``Host`` value, lowercased, without port, brackets or final dot.

    >>> host_name("[::1]:8000"), host_name("Example.COM.:80"), host_name("127.0.0.1")
    ('::1', 'example.com', '127.0.0.1')
    """
    text = value.strip().lower()
    if text.startswith("["):
        name, _, _ = text[1:].partition("]")
    elif text.count(":") == 1:
        name, _, _ = text.partition(":")
    else:
        name = text  # a bare IPv6 address, or no port
    return name.rstrip(".")


def host_port(value: str) -> int | None:
    """The port of a ``Host`` value, None when it names none (or not a number)."""
    text = value.strip()
    tail = text.rpartition("]")[2] if text.startswith("[") else text
    if tail.count(":") != 1:
        return None
    port = tail.rpartition(":")[2]
    return int(port) if port.isascii() and port.isdigit() and len(port) <= 5 else None


def allowed_host_names(names: Iterable[str], *, field: str = "allowed_hosts") -> frozenset[str]:
    """Check and normalize the operator's extra host names: bare names or addresses.

    >>> sorted(allowed_host_names(["Shoal.example.com", "[fd00::1]", "10.0.0.5"]))
    ['10.0.0.5', 'fd00::1', 'shoal.example.com']
    """
    result = set()
    for raw in names:
        if not isinstance(raw, str) or not raw.strip():
            raise InvalidInput(field, f"each entry must be a host name, got {raw!r}")
        text = raw.strip()
        if any(c in text for c in "/@ \t*") or "://" in text:
            raise InvalidInput(
                field, f"{raw!r} is not a host name: give the bare name, as 'shoal.example.com'"
            )
        if host_port(text) is not None or text.endswith(":"):
            raise InvalidInput(
                field, f"{raw!r} has a port: give the name alone (the port is not compared)"
            )
        name = host_name(text)
        if not name:
            raise InvalidInput(field, f"{raw!r} names no host")
        result.add(name)
    return frozenset(result)


__all__ = ["ALLOWED_HOSTS_ENV", "allowed_host_names", "host_name", "host_port"]
