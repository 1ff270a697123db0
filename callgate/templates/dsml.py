"""DSML prompt rendering (DeepSeek V3.2 and V4): the entry point `render`.

Knows: how callgate's render arguments map onto the reference encoders (`thinking` ->
thinking_mode "thinking"/"chat", `add_bos` -> add_default_bos_token), and which version's
layout to use. Does not know the layouts themselves (dsml_v32, dsml_v4), message validation
(dsml_messages) or the shared blocks (dsml_blocks).

Extra per-message fields understood: `reasoning_content`, `response_format` (system and
developer messages), `task` (V4 quick-instruction head) and the role `latest_reminder`
(V4). Tools go into the first system message (else the first developer message, else a new
empty system message at the start). Tool results are neutralised (see dsml_blocks); user,
system and assistant text is the client's own and is written verbatim, as the reference
does. Training-only reference inputs (`context`, `wo_eos`, `mask`) are not supported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from callgate.errors import TemplateError
from callgate.formats import ToolCallFormat
from callgate.templates.dsml_blocks import neutralize
from callgate.templates.dsml_messages import ROLES, normalize
from callgate.templates.dsml_v4 import render_v4
from callgate.templates.dsml_v32 import render_v32
from callgate.templates.render_options import RenderOptions

__all__ = ["neutralize", "render"]


def render(
    fmt: ToolCallFormat,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    options: RenderOptions,
) -> str:
    """The prompt for `messages` in `fmt` ("dsml-v3.2" or "dsml-v4").

    Raises TemplateError (naming the message index and field) for input the format cannot
    represent. add_generation_prompt=False leaves out the header that would open the next
    assistant turn after a final user turn or tool-result group.
    """
    thinking, drop_thinking, effort = options.thinking, options.drop_thinking, options.reasoning_effort
    add_bos, header = options.add_bos, options.add_generation_prompt
    if not isinstance(thinking, bool):
        raise TemplateError(f"thinking: expected true or false, got {thinking!r}", param="thinking")
    if fmt.name == "dsml-v3.2":
        if effort is not None:
            raise TemplateError("reasoning_effort: dsml-v3.2 has no reasoning effort levels", param="reasoning_effort")
        msgs = normalize(messages, tools, roles=ROLES - {"latest_reminder"})
        return render_v32(fmt, msgs, thinking=thinking, drop_thinking=drop_thinking, add_bos=add_bos, header=header)
    msgs = normalize(messages, tools, roles=ROLES)
    return render_v4(
        fmt,
        msgs,
        thinking=thinking,
        drop_thinking=drop_thinking,
        reasoning_effort=effort,
        add_bos=add_bos,
        header=header,
    )
