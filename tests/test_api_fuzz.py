"""API fuzzing with schemathesis against callgate's own OpenAPI document (/openapi.json of a
real `callgate serve --engine fake` process): schema-conforming and schema-violating
requests to every operation never get a 5xx, every 4xx carries OpenAI's error shape (on
/v1/messages... Anthropic's), and
the server is still healthy afterwards.

Knows: schemathesis' Python API (load the document from the URL, one hypothesis strategy
per operation and generation mode), `serve_fake` from tests/test_load.py.
Does not know: what a correct answer contains (other tests check that).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.core.result import Err, Ok

from tests.test_load import CALL, ServerProcess, serve_fake

EXAMPLES_PER_MODE = 40


def fuzz_operation(server: ServerProcess, operation: Any, mode: GenerationMode, seen: Counter[tuple[str, int]]) -> None:
    strategy = operation.as_strategy(generation_mode=mode)

    @settings(
        max_examples=EXAMPLES_PER_MODE,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def check(case: Any) -> None:
        send(server, case, seen)
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
            # Random messages almost never form a valid conversation (a tool turn needs the
            # call it answers ...): send the same fuzzed options once more with a plain one,
            # so tools, tool_choice, stop, response_format ... reach the engine and parsers.
            plain = dict(PLAIN_BODIES.get(case.path, {"messages": PLAIN}))
            if case.path.startswith("/v1/messages"):  # Anthropic's `model` is required: the served one
                plain["model"] = httpx.get(server.base + "/v1/models", timeout=30).json()["data"][0]["id"]
            case.body = {k: v for k, v in case.body.items() if k != "model"} | plain
            send(server, case, seen)

    check()


PLAIN = [{"role": "user", "content": "Hello"}]
PLAIN_BODIES: dict[str, dict[str, Any]] = {
    "/v1/quick": {"messages": PLAIN, "tasks": ["title"]},
    "/v1/completions": {"prompt": "Hello"},
    "/v1/responses": {"input": "Hello", "previous_response_id": None},
}


def send(server: ServerProcess, case: Any, seen: Counter[tuple[str, int]]) -> None:
    resp = case.call(base_url=server.base, timeout=30)
    seen[(case.path, resp.status_code)] += 1
    assert resp.status_code < 500, (case.method, case.path, case.body, resp.status_code, resp.text[:500])
    if resp.status_code >= 400 and case.path.startswith("/v1/messages"):  # Anthropic's error shape
        body = resp.json()
        assert body["type"] == "error" and {"type", "message"} <= set(body["error"]) <= {"type", "message", "code"}
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    elif resp.status_code >= 400:
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, resp.text[:500]
        assert isinstance(err["message"], str) and err["message"]


@pytest.mark.slow
def test_openapi_document_fuzz(tmp_path: Path) -> None:
    with serve_fake(tmp_path, ["Hello there.", CALL], "--max-queue", "64") as server:
        schema = schemathesis.openapi.from_url(server.base + "/openapi.json")
        results = list(schema.get_all_operations())
        assert all(isinstance(r, Ok) for r in results), [r.err() for r in results if isinstance(r, Err)]
        operations = [r.ok() for r in results if isinstance(r, Ok)]
        paths = {(op.method.upper(), op.path) for op in operations}
        posts = {
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/responses"),
            ("POST", "/v1/quick"),
        }
        assert posts | {("GET", "/health"), ("GET", "/v1/responses/{response_id}")} <= paths
        seen: Counter[tuple[str, int]] = Counter()
        for operation in operations:
            fuzz_operation(server, operation, GenerationMode.POSITIVE, seen)
            if operation.method.upper() == "POST":  # a GET without parameters has no invalid form
                fuzz_operation(server, operation, GenerationMode.NEGATIVE, seen)
        chat = "/v1/chat/completions"
        for path in (chat, "/v1/completions", "/v1/responses", "/v1/quick", "/v1/messages"):  # both sides reached
            assert seen[(path, 200)] and sum(n for (p, st), n in seen.items() if p == path and 400 <= st < 500)
        assert server.health()["in_flight"] == 0
        assert server.metric("callgate_engine_running") == 0
        assert "Traceback" not in server.output()
