"""The official `openai` client against a real uvicorn server (loopback, free port) backed
by a scripted FakeEngine: answers, streams, errors, concurrency, and disconnects."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from callgate.serving.app import create_app
from callgate.serving.engines.engine import GenerationRequest
from callgate.serving.engines.fake_engine import FakeEngine, FakeReply
from callgate.serving.settings import Limits, Settings
from tests.test_server_app import ASK, MODEL, WEATHER, SchemaCheck, call_text, make_settings

CALL = call_text("get_weather", {"city": "Oslo", "days": 3})


class Server:
    """A real uvicorn server in a thread, on a port the OS picked."""

    def __init__(self, settings: Settings, engine: FakeEngine, validator: SchemaCheck) -> None:
        self.engine, self.validator = engine, validator
        self.app = create_app(settings, engine=engine, validator=validator)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", ws="none", lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._clients: list[Any] = []  # closed on exit: no client socket is left for the GC to find later

    def __enter__(self) -> Server:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._clients:
            self._clients.pop().close()
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def client(self, api_key: str = "none", max_retries: int = 0, **kw: Any) -> Any:
        """The official client (typed Any: these tests send dict messages, not TypedDicts), closed
        with the server: an unclosed one leaves its socket to a later garbage collection, whose
        ResourceWarning pytest then pins on whichever test is running."""
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=max_retries, timeout=20, **kw)
        self._clients.append(client)
        return client

    def in_flight(self) -> int:
        n: int = self.app.state.service.admission.in_flight
        return n


def _wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(
        respond: Callable[[GenerationRequest], Any] | None = None, replies: Any = (), **settings_kw: Any
    ) -> Server:
        settings = make_settings(**settings_kw)
        engine = FakeEngine(replies=list(replies), respond=respond, max_model_len=settings.max_model_len)
        server = Server(settings, engine, SchemaCheck())
        servers.append(server.__enter__())
        return server

    yield start
    for server in servers:
        server.__exit__()


def test_plain_and_streamed_answers(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["Oslo ", "is ", "cold."])
    client = server.client()
    done = client.chat.completions.create(model=MODEL, messages=ASK)
    assert done.choices[0].message.content == "Oslo is cold." and done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens == 4
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = list(stream)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "Oslo is cold."
    assert [p.choices[0].finish_reason for p in parts if p.choices and p.choices[0].finish_reason] == ["stop"]
    assert parts[-1].usage is not None and parts[-1].usage.total_tokens == done.usage.total_tokens
    assert [m.id for m in client.models.list()] == [MODEL]


def test_streamed_tool_call_equals_the_non_streamed_one(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: [CALL[i : i + 5] for i in range(0, len(CALL), 5)])
    client = server.client()
    kw: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "required"}
    done = client.chat.completions.create(**kw)
    [whole] = done.choices[0].message.tool_calls or []
    assert done.choices[0].finish_reason == "tool_calls"
    name, args, call_id, finish = "", "", "", None
    for part in client.chat.completions.create(**kw, stream=True):
        if not part.choices:
            continue
        finish = part.choices[0].finish_reason or finish
        for tc in part.choices[0].delta.tool_calls or []:
            assert tc.index == 0
            call_id = tc.id or call_id
            name += (tc.function.name or "") if tc.function else ""
            args += (tc.function.arguments or "") if tc.function else ""
    assert whole.type == "function" and call_id.startswith("call_")
    assert (name, json.loads(args)) == (whole.function.name, json.loads(whole.function.arguments))
    assert json.loads(args) == {"city": "Oslo", "days": 3} and finish == "tool_calls"


def test_error_cases_raise_the_matching_client_errors(serve: Callable[..., Server]) -> None:
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city"'
    server = serve(
        respond=lambda req: broken if "BROKEN" in req.prompt else call_text("get_weather", {"town": 1}),
        max_model_len=2048,
        max_repairs=0,
        limits=Limits(max_body_bytes=20_000),
    )
    client = server.client()
    undeclared = {"type": "function", "function": {"name": "nope"}}
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "x"}}}
    orphan = [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "r"}]
    bad: list[tuple[dict[str, Any], type[openai.APIStatusError], int]] = [
        ({"messages": ASK, "n": 2}, openai.BadRequestError, 400),
        ({"messages": ASK, "tools": [WEATHER], "tool_choice": undeclared}, openai.BadRequestError, 400),
        ({"messages": ASK, "tools": [bad_tool]}, openai.BadRequestError, 400),
        ({"messages": orphan}, openai.BadRequestError, 400),
        ({"messages": [{"role": "user", "content": "long " * 600}]}, openai.BadRequestError, 400),
        ({"messages": [{"role": "user", "content": "x" * 30_000}]}, openai.APIStatusError, 413),
        ({"messages": [{"role": "user", "content": "BROKEN"}], "tools": [WEATHER]}, openai.APIStatusError, 502),
        ({"messages": ASK, "tools": [WEATHER]}, openai.UnprocessableEntityError, 422),
    ]
    for body, error, status in bad:
        with pytest.raises(error) as info:
            client.chat.completions.create(model=MODEL, **body)
        assert info.value.status_code == status, body
        assert isinstance(info.value.body, dict) and info.value.body.get("message")
    with pytest.raises(openai.APIError) as stream_info:
        list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "BROKEN"}], tools=[WEATHER], stream=True
            )
        )
    assert isinstance(stream_info.value.body, dict) and stream_info.value.body["type"] == "model_output_error"
    malformed = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": [}', timeout=10)
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    assert server.in_flight() == 0
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_api_key(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: "ok", api_key="k-123")
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").chat.completions.create(model=MODEL, messages=ASK)
    ok = server.client("k-123").chat.completions.create(model=MODEL, messages=ASK)
    assert ok.choices[0].message.content == "ok"


@pytest.mark.parametrize("name", [MODEL, "org/fake-model"])
def test_models_retrieve_answers_the_served_model_only(serve: Callable[..., Server], name: str) -> None:
    server = serve(respond=lambda req: "ok", api_key="k-123", served_model_name=name)
    client = server.client("k-123")
    got = client.models.retrieve(name)
    assert (got.id, got.object, got.owned_by) == (name, "model", "callgate")
    assert got.model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("other-model")
    assert info.value.body == {
        "message": "model: 'other-model' is not served here",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").models.retrieve(name)


def test_concurrent_requests_and_queue_limit(serve: Callable[..., Server]) -> None:
    def respond(req: GenerationRequest) -> FakeReply:
        number = re.search(r"request number (\d+)", req.prompt)
        assert number is not None
        return FakeReply(tuple(f"answer {number.group(1)}"), token_delay_s=0.01)

    server = serve(respond=respond, max_num_seqs=4, max_queue=4)
    client = server.client()
    results: dict[int, str] = {}
    errors: list[int] = []

    def one(i: int) -> None:
        msgs = [{"role": "user", "content": f"request number {i:03d}"}]
        try:
            resp = client.chat.completions.create(model=MODEL, messages=msgs)
            results[i] = resp.choices[0].message.content or ""
        except openai.RateLimitError as exc:
            assert exc.status_code == 429
            errors.append(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) + len(errors) == 12 and len(results) >= 8
    assert all(text == f"answer {i:03d}" for i, text in results.items())  # each answer went to its own request
    assert server.in_flight() == 0


def test_disconnect_mid_stream_aborts_and_frees_the_slot(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: FakeReply(tuple("word " * 400), token_delay_s=0.01), max_num_seqs=1, max_queue=0)
    client = server.client()
    stream = client.chat.completions.create(model=MODEL, messages=ASK, stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    assert server.in_flight() == 1
    stream.close()
    _wait_for(lambda: server.in_flight() == 0 and len(server.engine.aborted) == 1)
    assert server.engine.num_running() == 0
    with httpx.Client(timeout=30) as http:  # and a non-streaming client that walks away
        with pytest.raises(httpx.ReadTimeout):
            http.post(server.url + "/v1/chat/completions", json={"messages": ASK}, timeout=0.3)
    _wait_for(lambda: server.in_flight() == 0 and len(server.engine.aborted) == 2)
    server.engine.respond = lambda req: "free again"
    again = client.chat.completions.create(model=MODEL, messages=ASK)
    assert again.choices[0].message.content == "free again"


def test_queue_full_and_validator_down(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: FakeReply(tuple("slow " * 100), token_delay_s=0.01), max_num_seqs=1, max_queue=1)
    client = server.client()
    held = [client.chat.completions.create(model=MODEL, messages=ASK, stream=True) for _ in range(2)]
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK)
    assert info.value.status_code == 429 and isinstance(info.value.body, dict)
    assert info.value.body["type"] == "rate_limit_error"
    for stream in held:
        stream.close()
    _wait_for(lambda: server.in_flight() == 0)
    server.engine.respond = lambda req: CALL
    server.validator.down = True
    with pytest.raises(openai.InternalServerError) as down:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    assert down.value.status_code == 503 and isinstance(down.value.body, dict)
    assert down.value.body["type"] == "validator_unavailable"


def requests_seen(server: Server, status: int, route: str = "/v1/chat/completions") -> int:
    """How many requests to `route` the server counted with `status` (its /metrics)."""
    text = httpx.get(server.url + "/metrics", timeout=5).text
    found = re.search(rf'^callgate_requests_total\{{route="{re.escape(route)}",status="{status}"\}} (\S+)$', text, re.M)
    return 0 if found is None else int(float(found.group(1)))


POST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens")


@pytest.mark.parametrize("route", [*POST_ROUTES, "/v1/quick"])
def test_a_client_gone_while_sending_its_body_is_a_499_not_an_error(
    serve: Callable[..., Server], route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """QA's case: Content-Length 1000, ten bytes sent, the socket closed. The client left
    (499, as after the body), not a server failure (500 and an ERROR traceback)."""
    server = serve(respond=lambda req: "ok")
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        head += "Content-Length: 1000\r\n\r\n"
        sock.sendall(head.encode() + b'{"model":')
    _wait_for(lambda: requests_seen(server, 499, route) == 1)
    assert requests_seen(server, 500, route) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    done = server.client().chat.completions.create(model=MODEL, messages=ASK)  # and the server serves on
    assert done.choices[0].message.content == "ok"
