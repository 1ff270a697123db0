"""The idempotency key through the real app (ASGI, scripted FakeEngine, hermes): a client's
retry of the same request is the same action (the same key, whatever the request and call
ids), the same call asked in a later turn is a new one, actors are told apart, and the
x-callgate-actor header counts only on a server started to trust it."""

from __future__ import annotations

import json
from typing import Any

from callgate.serving.handoff.idempotency import ANONYMOUS, conversation_scope, idempotency_key
from tests import test_server_app
from tests.test_server_app import ASK, WEATHER, call_text, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture

CALL = call_text("get_weather", {"city": "Oslo", "days": 2})
ARGUMENTS = {"days": 2, "city": "Oslo"}


async def _envelope(h: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[Any, Any]:
    """(the validator's envelope, the response body) of one chat request with one call."""
    resp = await h.client.post("/v1/chat/completions", json={"tools": [WEATHER], **body}, headers=headers or {})
    assert resp.status_code == 200, resp.text
    return h.validator.seen[-1], resp.json()


async def test_a_retried_request_is_the_same_action(make_harness: Any) -> None:
    h = make_harness([CALL, CALL])
    first, body1 = await _envelope(h, {"messages": ASK})
    again, body2 = await _envelope(h, {"messages": ASK})
    assert body1["id"] != body2["id"] and first.request_id != again.request_id
    assert first.call_id != again.call_id  # the model's call ids are fresh each time
    assert (first.actor, first.scope) == (ANONYMOUS, conversation_scope(ASK))
    assert (
        first.idempotency_key
        == again.idempotency_key
        == idempotency_key(ANONYMOUS, "get_weather", ARGUMENTS, first.scope)
    )
    streamed = await h.client.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], "stream": True})
    assert streamed.status_code == 200 and h.validator.seen[-1].idempotency_key == first.idempotency_key


async def test_the_same_call_in_a_later_turn_is_a_new_action(make_harness: Any) -> None:
    h = make_harness([CALL, CALL])
    first, body = await _envelope(h, {"messages": ASK})
    [call] = body["choices"][0]["message"]["tool_calls"]
    later = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 3})},
        {"role": "user", "content": "And once more, please."},
    ]
    second, _ = await _envelope(h, {"messages": later})
    assert (second.tool, second.arguments) == (first.tool, first.arguments)
    assert second.scope == conversation_scope(later) != first.scope
    assert second.idempotency_key != first.idempotency_key


async def test_actors_differ_and_the_header_counts_only_when_trusted(make_harness: Any) -> None:
    h = make_harness([CALL] * 4)
    alice, _ = await _envelope(h, {"messages": ASK, "user": "alice"})
    bob, _ = await _envelope(h, {"messages": ASK, "user": "bob"})
    forged, _ = await _envelope(h, {"messages": ASK, "user": "alice"}, {"x-callgate-actor": "mallory"})
    nobody, _ = await _envelope(h, {"messages": ASK}, {"x-callgate-actor": "mallory"})
    assert (alice.actor, bob.actor, forged.actor, nobody.actor) == ("alice", "bob", "alice", ANONYMOUS)
    assert alice.scope == bob.scope and alice.idempotency_key != bob.idempotency_key
    assert forged.idempotency_key == alice.idempotency_key  # an untrusted header changes nothing
    trusted = make_harness([CALL] * 3, settings=make_settings(trust_actor_header=True))
    gateway, _ = await _envelope(trusted, {"messages": ASK, "user": "alice"}, {"x-callgate-actor": "tenant-7/carol"})
    body_only, _ = await _envelope(trusted, {"messages": ASK, "user": "alice"})
    assert (gateway.actor, body_only.actor) == ("tenant-7/carol", "alice")
    assert gateway.idempotency_key == idempotency_key("tenant-7/carol", "get_weather", ARGUMENTS, alice.scope)
    assert body_only.idempotency_key == alice.idempotency_key


async def test_a_repair_round_keeps_the_turn_scope(make_harness: Any) -> None:
    h = make_harness([call_text("get_weather", {"town": "Oslo"}), CALL])
    resp = await h.post({"messages": ASK, "tools": [WEATHER]})
    assert resp.status_code == 200 and resp.json()["callgate"]["repairs"] == 1
    rejected, accepted = h.validator.seen
    assert rejected.scope == accepted.scope == conversation_scope(ASK)
    assert accepted.idempotency_key == idempotency_key(ANONYMOUS, "get_weather", ARGUMENTS, accepted.scope)
