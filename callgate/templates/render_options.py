"""The options of one render: what a prompt asks of the template besides the conversation.

Knows: the five switches every template reads (or refuses) and their defaults. Does not
know: which format honours which (each template checks the ones it reads and refuses a
switch it cannot honour, with a TemplateError naming it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """`thinking`: open a reasoning block for the answer (formats with one). `drop_thinking`:
    leave earlier assistant reasoning out (False keeps it, where the format can). `reasoning_effort`:
    the format's effort level, None for its default (Qwen3 ChatML: "none" is its
    `enable_thinking=False`). `add_bos`: write the framing's BOS text. `add_generation_prompt`:
    end with the header that opens the assistant's turn."""

    thinking: bool = False
    drop_thinking: bool = True
    reasoning_effort: str | None = None
    add_bos: bool = True
    add_generation_prompt: bool = True
