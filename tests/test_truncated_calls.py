"""A call that budget closing cut short is flagged `truncated`, everywhere it is reported.

The processor (callgate.decoding.processor) marks a request it closed by plan in
`closing_marks`; the server reads the mark once the generation ends. Here a FakeEngine plays
the processor's part (it marks the request it answers), so the test runs without vLLM; the
processor's own marking is tested in tests/test_decoding_processor.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from callgate.decoding import closing_marks
from callgate.serving.app import create_app
from callgate.serving.engines.engine import GenerationRequest
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.handoff.validation import ENVELOPE_SCHEMA, Envelope, Verdict, envelope_dict
from tests.test_server_app import ASK, WEATHER, call_text, make_settings

CUT = call_text("get_weather", {"city": "Os"})
TWO = call_text("get_weather", {"city": "Oslo"}) + "\n" + CUT


class Recording:
    """A validator that keeps every envelope it was sent and accepts them."""

    name = "recording"

    def __init__(self) -> None:
        self.envelopes: list[dict[str, Any]] = []

    async def validate(self, req: Envelope) -> Verdict:
        self.envelopes.append(envelope_dict(req))
        return Verdict.accept(self.name)


def _engine(tmp_path: Path, reply: str, *, closed: bool) -> FakeEngine:
    def respond(req: GenerationRequest) -> str:
        if closed:
            closing_marks.mark(str(tmp_path), req.request_id)
        return reply

    engine = FakeEngine(respond=respond)
    engine.closing_dir = str(tmp_path)  # type: ignore[attr-defined]
    return engine


async def _ask(engine: FakeEngine, validator: Recording, **body: Any) -> httpx.Response:
    app = create_app(make_settings(constrained=False), engine=engine, validator=validator)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://callgate.test") as client:
        return await client.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], **body})


async def test_the_call_closing_cut_is_truncated_in_candidate_block_and_envelope(tmp_path: Path) -> None:
    validator = Recording()
    resp = await _ask(_engine(tmp_path, TWO, closed=True), validator)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert [c["function"]["name"] for c in body["choices"][0]["message"]["tool_calls"]] == ["get_weather"] * 2
    assert [c["truncated"] for c in body["callgate"]["candidates"]] == [False, True]
    assert [e["truncated"] for e in validator.envelopes] == [False, True]
    for envelope in validator.envelopes:
        jsonschema.validate(envelope, ENVELOPE_SCHEMA)
    assert not list(tmp_path.iterdir())  # the mark is taken, not left behind


async def test_a_call_that_ended_by_itself_is_not_truncated(tmp_path: Path) -> None:
    validator = Recording()
    resp = await _ask(_engine(tmp_path, TWO, closed=False), validator)
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert [c["truncated"] for c in body["callgate"]["candidates"]] == [False, False]
    assert [e["truncated"] for e in validator.envelopes] == [False, False]


async def test_a_streamed_cut_call_ends_with_length_and_the_flag(tmp_path: Path) -> None:
    validator = Recording()
    resp = await _ask(_engine(tmp_path, CUT, closed=True), validator, stream=True)
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    last = next(c for c in reversed(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    assert last["choices"][0]["finish_reason"] == "length"
    assert [c["truncated"] for c in last["callgate"]["candidates"]] == [True]
