"""What a grammar is built from: a request's call plan (callgate.call_plan) in one format.

Knows: which parts of a plan the grammar holds (a named plan is one call, no schema under
none / response_format, `parallel` fixed where no call can be written) and the canonical
cache key of a request's grammar. Does not know: OpenAI's shapes (the plan normalised them
once), formats or regexes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.call_plan import CallPlan, Mode, Thinking, ToolSpec, tool_specs

__all__ = ["GrammarRequest", "Mode", "Thinking", "ToolSpec", "grammar_of", "grammar_request", "tool_specs"]

# 2: JSON-call arguments admit only objects (`parameters: {}` allowed any value)
# 3: an array schema with `minItems` above `maxItems: 0` admits no array (it admitted `[]`)
# 4: `thinking` is three-valued; false (the prompt closed a reasoning block) admits no
#    leading block, where it meant "no switch" (a leading block allowed) before
# 5: numbers are bounded below 1e308 (integer part <= 20 digits, exponent bounded); a
#    `type` beside enum/const/anyOf/oneOf/allOf narrows it; $ref chains are followed
# 6: qwen3-xml writes a value its parser reads by type: branches in order, text after `string`
# 7: qwen3-xml types an untyped `const`/`enum` by its values (`enum: [1, "a"]` writes `1` too)
# 8: llama3-json answers beside tools under auto never start as a call (json_answer.py)
# 9: json-family content keeps a numbered run of reserved tokens out by its prefix (`<SPECIAL_`)
GRAMMAR_VERSION = 9


@dataclass(frozen=True, slots=True)
class GrammarRequest:
    """A normalised request. `tools` holds only the callable tools (the named one for
    `named`); `response_schema` is the JSON schema of the content (json_object: `{"type":
    "object"}`), None for free text. `thinking` is what the prompt did with the format's
    reasoning block (a `Thinking`)."""

    format: str
    mode: Mode
    tools: tuple[ToolSpec, ...]
    parallel: bool
    response_schema: Mapping[str, Any] | None
    thinking: Thinking

    def key(self) -> str:
        """Canonical cache key: equal requests (as far as the grammar can tell) share it.

        Property order matters to the grammar, so schemas are serialised in their order.
        """
        doc = {
            "v": GRAMMAR_VERSION,
            "format": self.format,
            "mode": self.mode,
            "tools": [[t.name, t.parameters] for t in self.tools],
            "parallel": self.parallel,
            "response": self.response_schema,
            "thinking": self.thinking,
        }
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)
        return f"{self.format}:{self.mode}:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def grammar_of(format: str, plan: CallPlan) -> GrammarRequest | None:
    """The grammar request of a call plan in format `format`; None when nothing constrains
    the output (free text: no tool declared, no response schema)."""
    if plan.mode == "named":
        return GrammarRequest(format, "named", plan.tools[:1], False, None, plan.thinking)
    if plan.mode in ("required", "auto"):
        return GrammarRequest(format, plan.mode, plan.tools, plan.parallel, plan.response_schema, plan.thinking)
    # No call can be written below: `parallel` is set, so that the key does not split on it.
    if plan.mode == "response_format":
        return GrammarRequest(format, "response_format", (), True, plan.response_schema, plan.thinking)
    if plan.declared:
        return GrammarRequest(format, "none", (), True, None, plan.thinking)
    return None


def grammar_request(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    *,
    thinking: Thinking = None,
) -> GrammarRequest | None:
    """`grammar_of` the plan of raw OpenAI-style values (`CallPlan.of`, which raises
    InvalidRequestError for a tool_choice naming no declared tool, `required` without
    tools, or malformed shapes); for tests and benchmarks that hold no ChatRequest."""
    plan = CallPlan.of(tools, tool_choice, parallel_tool_calls, response_format, thinking=thinking)
    return grammar_of(format, plan)
