"""The bounded in-memory store of /v1/responses: what `previous_response_id`, `GET`,
`DELETE` and `GET .../input_items` read.

Knows: each stored response's JSON object, the conversation before its input (`history`,
the chain it continued), its own input items and its output items, all as Responses items
(plain dicts); the two bounds (count and bytes, the bytes being the entry's compact JSON)
and least-recently-used eviction (a `get` counts as a use). Does not know: HTTP, requests,
or how items become messages.

An entry larger than the byte bound on its own is not kept (`put` returns False), so a
later `get` of its id is None, as for an evicted one. Single-threaded by design: the event
loop is the only caller.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Item = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: Mapping[str, Any]  # the response object as returned to the client
    history: tuple[Item, ...]  # the conversation before `input_items` (previous responses)
    input_items: tuple[Item, ...]
    output_items: tuple[Item, ...]
    size_bytes: int

    def conversation(self) -> tuple[Item, ...]:
        """The items a response chained onto this one continues: history, input, output."""
        return (*self.history, *self.input_items, *self.output_items)


class ResponseStore:
    """At most `max_responses` entries and `max_bytes` bytes; the least recently used go first."""

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(
        self,
        response: Mapping[str, Any],
        history: Sequence[Item],
        input_items: Sequence[Item],
        output_items: Sequence[Item],
    ) -> bool:
        """Keep the response under `response["id"]`, evicting as needed; False when it alone
        exceeds a bound (then it is not kept)."""
        key = str(response["id"])
        size = len(_json(response)) + sum(len(_json(i)) for i in (*history, *input_items, *output_items))
        self.delete(key)
        if self.max_responses < 1 or size > self.max_bytes:
            return False
        self._entries[key] = StoredResponse(
            dict(response), tuple(history), tuple(input_items), tuple(output_items), size
        )
        self._bytes += size
        while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size_bytes
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size_bytes
        return True


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
