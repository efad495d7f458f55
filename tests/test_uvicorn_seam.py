"""The private parts of uvicorn that ``shoal api``'s protocol builds on are still there.

uvicorn offers no public setting for a deadline on a request head or for a
lingering close (its ``Config`` has ``timeout_keep_alive``, which stops at a
request's first byte, and ``h11_max_incomplete_event_size``, a size). So
``shoal.api.server.BoundedHeadProtocol`` and ``shoal.api.linger.LingeringH11Protocol``
subclass uvicorn's ``H11Protocol``, which is not public API, and pyproject.toml
pins uvicorn to the releases they were tested with.

These tests name every method, attribute and call the subclasses rely on. A
uvicorn release that renames or reshapes one fails here, by name, instead of
leaving a server that runs without its head deadline or its lingering close.
The behaviour itself is tested in tests/test_header_timeout.py,
tests/test_api_answer_before_close.py and tests/test_servers_bound_heads.py.
"""

from __future__ import annotations

import asyncio
import inspect
import tomllib
from pathlib import Path
from typing import Any

import h11
import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http import h11_impl
from uvicorn.server import ServerState

from shoal.api.linger import LingeringH11Protocol
from shoal.api.server import BoundedHeadProtocol

ROOT = Path(__file__).parent.parent
RECHECK = (
    "shoal.api.server and shoal.api.linger subclass uvicorn's private H11Protocol. "
    "Re-check both against uvicorn {version}'s uvicorn/protocols/http/h11_impl.py, "
    "run tests/test_header_timeout.py, tests/test_api_answer_before_close.py and "
    "tests/test_servers_bound_heads.py, then update this test and the uvicorn pin "
    "in pyproject.toml (docs/api.md, 'The server underneath')."
)

# What the subclasses override or call, with the parameters they pass or accept.
METHODS: dict[str, list[str]] = {
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "handle_events": ["self"],
    "on_response_complete": ["self"],
    "send_400_response": ["self", "msg"],
    "shutdown": ["self"],
}


def _recheck(problem: str) -> str:
    return f"{problem}\n{RECHECK.format(version=uvicorn.__version__)}"


def _api_requirement() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [
        r for r in project["optional-dependencies"]["api"] if Requirement(r).name == "uvicorn"
    ]
    return Requirement(spec)


def test_the_installed_uvicorn_is_one_shoal_was_tested_with() -> None:
    requirement = _api_requirement()
    assert requirement.specifier.contains(Version(uvicorn.__version__)), _recheck(
        f"uvicorn {uvicorn.__version__} is installed, outside the tested range "
        f"{requirement.specifier} of pyproject.toml's api extra."
    )
    # An upper bound: a release nobody ran the tests on is not allowed in.
    assert any(s.operator in ("<", "<=", "==", "~=") for s in requirement.specifier), _recheck(
        f"pyproject.toml's api extra pins uvicorn as {requirement}, without an upper bound."
    )


def test_the_protocol_class_is_where_shoal_imports_it_from() -> None:
    assert isinstance(getattr(h11_impl, "H11Protocol", None), type), _recheck(
        "uvicorn.protocols.http.h11_impl.H11Protocol is gone."
    )
    assert issubclass(BoundedHeadProtocol, h11_impl.H11Protocol)
    assert issubclass(LingeringH11Protocol, h11_impl.H11Protocol)
    # uvicorn.Config(http=<a class>) is how api_config hands the protocol over.
    assert "http" in inspect.signature(uvicorn.Config).parameters, _recheck(
        "uvicorn.Config no longer takes http=, the protocol class api_config passes."
    )
    assert hasattr(uvicorn.Config("x:y"), "h11_max_incomplete_event_size"), _recheck(
        "uvicorn.Config has no h11_max_incomplete_event_size, which BoundedHeadProtocol reads."
    )


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_shoal_overrides_or_calls_keeps_its_signature(name: str) -> None:
    method = getattr(h11_impl.H11Protocol, name, None)
    assert callable(method), _recheck(f"H11Protocol.{name} is gone.")
    parameters = list(inspect.signature(method).parameters)
    assert parameters == METHODS[name], _recheck(
        f"H11Protocol.{name} takes {parameters}, shoal expects {METHODS[name]}."
    )


def test_the_state_shoal_reads_is_set_where_shoal_reads_it() -> None:
    # BoundedHeadProtocol replaces self.conn after H11Protocol.__init__ made it,
    # and reads config, loop, transport, client and cycle; shutdown reads
    # cycle.response_complete.
    init = inspect.getsource(h11_impl.H11Protocol.__init__)
    for attribute in ("self.conn = h11.Connection(", "self.config =", "self.loop =", "self.cycle"):
        assert attribute in init, _recheck(f"H11Protocol.__init__ no longer sets {attribute!r}.")
    made = inspect.getsource(h11_impl.H11Protocol.connection_made)
    for attribute in ("self.transport = transport", "self.client ="):
        assert attribute in made, _recheck(
            f"H11Protocol.connection_made no longer sets {attribute!r}."
        )
    cycle = inspect.getsource(h11_impl.RequestResponseCycle.__init__)
    assert "self.response_complete" in cycle, _recheck(
        "RequestResponseCycle has no response_complete, which LingeringH11Protocol.shutdown reads."
    )


def test_h11s_refusals_still_reach_send_400_response_while_the_error_is_handled() -> None:
    # BoundedHeadProtocol.send_400_response reads the h11 error being handled
    # (sys.exception()) to answer 431 or name the header at fault.
    source = inspect.getsource(h11_impl.H11Protocol.handle_events)
    handler = source.partition("except h11.RemoteProtocolError")[2].partition("if event is")[0]
    assert "self.send_400_response(" in handler, _recheck(
        "H11Protocol.handle_events no longer calls send_400_response inside "
        "`except h11.RemoteProtocolError`."
    )
    # The head timer and the head cap read and replace the parser through self.conn.
    for use in ("self.conn.receive_data(", "self.conn.next_event()"):
        assert use in inspect.getsource(h11_impl.H11Protocol), _recheck(
            f"H11Protocol no longer parses with {use!r}."
        )


async def test_the_connection_shoal_builds_is_the_one_uvicorn_parses_with() -> None:
    # BoundedHeadProtocol swaps uvicorn's connection for HeadCappedConnection.
    config = uvicorn.Config(app=_app, http=BoundedHeadProtocol, lifespan="off")
    config.load()
    protocol = BoundedHeadProtocol(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    assert isinstance(protocol.conn, h11.Connection)
    assert type(protocol.conn).__name__ == "HeadCappedConnection"
    assert protocol.conn.their_state is h11.IDLE


async def _app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("never called")
