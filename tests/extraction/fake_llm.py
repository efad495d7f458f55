"""A fake OpenAI-compatible chat-completions endpoint, served on 127.0.0.1 in a thread.

It answers from the corpus key: it finds which paper the prompt carries (by
its true title), reads the field names from the JSON Schema in the system
prompt, and answers the true values that the chunks it was shown state
(``null`` for the others, as a model that does not guess would), each with a
quote: the value as printed (authors: the first name). A script makes it misbehave the way real
endpoints do:

- ``burst``: request numbers (1-based, in arrival order) answered 429 or 503;
- ``retry_after``: request numbers answered 429 with this ``Retry-After`` (seconds);
- ``slow``: files whose first call is held until the client times out and
  hangs up (recorded as ``late``);
- ``malformed_once``: files whose first answer is not JSON (a repair fixes it);
- ``malformed_always``: files whose answers are never valid;
- ``reject``: files answered 400 (a permanent refusal);
- ``delay_s``: every answer waits this long (keeps items in flight);
- ``invent_quotes``: files whose sample size is "quoted" from a sentence the
  paper does not contain (the evidence check must flag it);
- ``unavailable``: files whose every call is answered 503;
- ``hang``: files whose every call is held until the client times out.

Every request is recorded with the item it was for (the ``X-Shoal-Item``
header: ``task/item/attempt``) and what the fake did, so a test can check
that no item was answered after its result was recorded; and with what it
was sent (``requests``: the fields its schema asks, the paper's text shown),
so a test can check what reached the endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

SCHEMA_MARK = "The answer must match this JSON Schema:"


@dataclass
class Script:
    burst: dict[int, int] = field(default_factory=dict)  # request number -> status
    retry_after: dict[int, int] = field(default_factory=dict)  # request number -> seconds
    slow: set[str] = field(default_factory=set)
    malformed_once: set[str] = field(default_factory=set)
    malformed_always: set[str] = field(default_factory=set)
    reject: set[str] = field(default_factory=set)
    delay_s: float = 0.0
    invent_quotes: set[str] = field(default_factory=set)
    unavailable: set[str] = field(default_factory=set)
    hang: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Sent:
    """One request as the endpoint received it."""

    seq: int
    file: str | None
    fields: tuple[str, ...]  # the keys its JSON Schema asks for (``_quotes`` aside)
    user: str  # the user messages' text: the chunks of the paper shown


@dataclass(frozen=True)
class Call:
    seq: int
    item: int | None
    attempt: int | None
    file: str | None
    outcome: str  # answered | malformed | late | rejected | rate_limited | unavailable
    response_id: str | None


def _norm(text: str) -> str:
    flat = " ".join(text.split()).casefold()
    return re.sub(r"(?<=[a-z])- (?=[a-z])", "-", flat)  # a word hyphenated at a line end


def _shown(value: Any, text: str) -> Any:
    """``value`` if the text shown states it, else None."""
    if value is None:
        return None
    parts = str(value).split(", ") if isinstance(value, str) else [str(value)]
    return value if all(_norm(p).rstrip(".") in text for p in parts) else None


def _quote(value: Any) -> str:
    return str(value).split(", ")[0].rstrip(".") if isinstance(value, str) else str(value)


class FakeModel:
    """The endpoint's state; ``calls`` is appended by the server thread, read by tests."""

    def __init__(self, key: dict[str, Any], script: Script) -> None:
        self.script = script
        self.papers = {
            _norm(d["fields"]["title"]): (d["file"], d["fields"])
            for d in key["documents"]
            if d["fields"]
        }
        self.calls: list[Call] = []
        self.requests: list[Sent] = []  # appended by the server thread, read by tests
        self._lock = threading.Lock()
        self._seq = 0
        self._seen: set[str] = set()  # files whose first call happened
        self._delayed = 0  # calls inside their delay_s now

    def _next(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def answers_for(self, item: int) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.item == item and c.outcome == "answered"]

    def in_delay(self) -> int:
        """Calls the endpoint holds in their ``delay_s`` right now (answers not yet sent)."""
        with self._lock:
            return self._delayed

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def sent(self) -> list[Sent]:
        with self._lock:
            return list(self.requests)

    def _first_call(self, file: str) -> bool:
        with self._lock:
            first = file not in self._seen
            self._seen.add(file)
            return first

    def app(self) -> FastAPI:
        api = FastAPI()

        @api.post("/v1/chat/completions")
        async def complete(request: Request) -> Response:
            seq = self._next()
            body = await request.json()
            item, attempt = _item(request.headers.get("x-shoal-item", ""))
            messages = body["messages"]
            text = _norm(" ".join(m["content"] for m in messages if m["role"] == "user"))
            file, truth = next(
                ((f, t) for title, (f, t) in self.papers.items() if title in text), (None, None)
            )

            def record(outcome: str, response_id: str | None = None) -> None:
                self._record(Call(seq, item, attempt, file, outcome, response_id))

            schema = json.loads(messages[0]["content"].split(SCHEMA_MARK, 1)[1])
            keys = [k for k in schema["properties"] if not k.startswith("_")]
            user = "\n".join(m["content"] for m in messages if m["role"] == "user")
            with self._lock:
                self.requests.append(Sent(seq, file, tuple(keys), user))

            wait = self.script.retry_after.get(seq)
            if wait is not None:
                record("rate_limited")
                return JSONResponse(
                    {"error": {"message": "rate limit reached"}},
                    status_code=429,
                    headers={"Retry-After": str(wait)},
                )
            status = self.script.burst.get(seq)
            if status is not None:
                record("rate_limited" if status == 429 else "unavailable")
                return JSONResponse({"error": {"message": "slow down"}}, status_code=status)
            if file in self.script.unavailable:
                record("unavailable")
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            if file in self.script.reject:
                record("rejected")
                return JSONResponse({"error": {"message": "model not allowed"}}, status_code=400)
            if self.script.delay_s:
                with self._lock:
                    self._delayed += 1
                try:
                    await asyncio.sleep(self.script.delay_s)  # noqa: TID251 - a model server's latency
                finally:
                    with self._lock:
                        self._delayed -= 1
            repairing = len(messages) > 2
            held = file in self.script.slow and not repairing and self._first_call(file)
            if held or file in self.script.hang:
                # Held until the client gives up and hangs up: no race between
                # a fixed delay here and the client's timeout on a busy machine.
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                record("late")  # the client timed out before this
                return JSONResponse(_completion("late", "{}", messages))
            malformed = file in self.script.malformed_always or (
                file in self.script.malformed_once and not repairing
            )
            if malformed or truth is None:
                content = "Sure! Here are the fields: {title: " + (file or "?") + "}"
                record("malformed")
            else:
                shown = {k: _shown(truth.get(k), text) for k in keys}
                quotes = {k: _quote(v) for k, v in shown.items() if v is not None}
                if file in self.script.invent_quotes and "sample_size" in quotes:
                    quotes["sample_size"] = f"Exactly {quotes['sample_size']} people took part."
                content = json.dumps(shown | {"_quotes": quotes}, ensure_ascii=False)
                record("answered", f"fake-{seq}")
            return JSONResponse(_completion(f"fake-{seq}", content, messages))

        return api


def _item(header: str) -> tuple[int | None, int | None]:
    match = re.fullmatch(r"[^/]*/(\d+)/(\d+)", header)
    return (int(match[1]), int(match[2])) if match else (None, None)


def _completion(response_id: str, content: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    prompt = sum(len(m["content"]) for m in messages) // 4
    return {
        "id": response_id,
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(content) // 4},
    }


class _ThreadServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # not the main thread: leave signals to pytest


@contextlib.contextmanager
def serve_fake(model: FakeModel) -> Iterator[str]:
    """Serve ``model`` on a free port in a thread of its own; yields the base URL (``.../v1``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _ThreadServer(
        uvicorn.Config(model.app(), lifespan="off", log_level="warning", ws="none", http="h11")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "the fake endpoint did not start"
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
