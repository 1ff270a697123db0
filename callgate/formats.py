"""Tool-call format specs: the single source of truth for every wire format.

Knows: each format's markers, special tokens, how arguments are encoded, the trigger
that opens a call block, the chat framing it belongs to, its reasoning markers and its
quick-instruction heads.
Does not know: how to render, parse or constrain (templates/, parsers/, constraints/
derive all of that from these specs, so the three cannot drift apart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Family = Literal["dsml", "qwen3-xml", "json"]
ArgumentEncoding = Literal["dsml-typed", "schema-typed-text", "json"]


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """One wire format.

    `markers` holds the family-specific literal texts (block open/close, invoke and
    parameter tags, ...) under names that the family's renderer, parser and grammar share.
    `special_tokens` lists every text that is a control token for the model; text from
    untrusted sources (tool results, user content) must never produce one in a prompt.
    `call_trigger` is the text whose appearance in free text commits the model to a call
    block (the lazy `auto` grammar starts there). `quick_tasks` maps a quick-instruction
    head to the suffix that asks for it (dsml-v4: the model's own task tokens).
    """

    name: str
    family: Family
    framing: str  # chat framing, e.g. "deepseek-v4", "chatml-qwen3", "llama3.1", "mistral-v3-tekken"
    argument_encoding: ArgumentEncoding
    bos: str  # "" where the framing writes none
    eos: str  # the token that ends an assistant turn in model output
    call_trigger: str
    reasoning_open: str | None
    reasoning_close: str | None
    markers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    special_tokens: tuple[str, ...] = ()
    quick_tasks: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    native_call_ids: bool = False  # True where the model writes its own call ids (mistral)


def _frozen(d: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(d))


# =========================================================================================
# DSML (DeepSeek V3.2, V4) -- owned by the DSML work; see golden/dsml/FORMAT.md
# =========================================================================================

_DSML_BAR = "\uff5c"  # U+FF5C FULLWIDTH VERTICAL LINE, never the ASCII "|"
_DSML = f"{_DSML_BAR}DSML{_DSML_BAR}"
_DSML_BOS = f"<{_DSML_BAR}begin\u2581of\u2581sentence{_DSML_BAR}>"  # U+2581 LOWER ONE EIGHTH BLOCK
_DSML_EOS = f"<{_DSML_BAR}end\u2581of\u2581sentence{_DSML_BAR}>"
_DSML_TASKS = ("action", "query", "authority", "domain", "title", "read_url")


def _dsml_token(name: str) -> str:
    return f"<{_DSML_BAR}{name}{_DSML_BAR}>"


def _dsml_markers(block: str, version_markers: Mapping[str, str]) -> Mapping[str, str]:
    """The DSML call syntax, split at the points where a parser or grammar branches.

    block    = "\\n\\n" block_open "\\n" invoke *("\\n" invoke) "\\n" block_close
    invoke   = invoke_open NAME tag_end "\\n" (param *("\\n" param) | "") "\\n" invoke_close
    param    = param_open KEY string_attr ("true" | "false") tag_end VALUE param_close
    """
    return _frozen(
        {
            "block": block,
            "dsml": _DSML,
            "call_prefix": "\n\n",
            "block_open": f"<{_DSML}{block}>",
            "block_close": f"</{_DSML}{block}>",
            "invoke_open": f'<{_DSML}invoke name="',
            "invoke_close": f"</{_DSML}invoke>",
            "param_open": f'<{_DSML}parameter name="',
            "string_attr": '" string="',
            "param_close": f"</{_DSML}parameter>",
            "tag_end": '">',
            "user": _dsml_token("User"),
            "assistant": _dsml_token("Assistant"),
            **version_markers,
        }
    )


def _dsml_special_tokens(*extra: str) -> tuple[str, ...]:
    return (_DSML_BOS, _DSML_EOS, _dsml_token("User"), _dsml_token("Assistant"), "<think>", "</think>", _DSML, *extra)


DSML_V32 = ToolCallFormat(
    name="dsml-v3.2",
    family="dsml",
    framing="deepseek-v3.2",
    argument_encoding="dsml-typed",
    bos=_DSML_BOS,
    eos=_DSML_EOS,
    call_trigger=f"\n\n<{_DSML}function_calls>",
    reasoning_open="<think>",
    reasoning_close="</think>",
    markers=_dsml_markers(
        "function_calls",
        {
            "results_open": "<function_results>",
            "results_close": "</function_results>",
            "result_open": "<result>",
            "result_close": "</result>",
        },
    ),
    special_tokens=_dsml_special_tokens(),
)

DSML_V4 = ToolCallFormat(
    name="dsml-v4",
    family="dsml",
    framing="deepseek-v4",
    argument_encoding="dsml-typed",
    bos=_DSML_BOS,
    eos=_DSML_EOS,
    call_trigger=f"\n\n<{_DSML}tool_calls>",
    reasoning_open="<think>",
    reasoning_close="</think>",
    markers=_dsml_markers(
        "tool_calls",
        {
            "latest_reminder": _dsml_token("latest_reminder"),
            "result_open": "<tool_result>",
            "result_close": "</tool_result>",
        },
    ),
    special_tokens=_dsml_special_tokens(_dsml_token("latest_reminder"), *(_dsml_token(t) for t in _DSML_TASKS)),
    quick_tasks=_frozen({t: _dsml_token(t) for t in _DSML_TASKS}),
)

# Quick-instruction heads for formats without task tokens (every format but dsml-v4): a
# text instruction appended to the last user message (after a blank line; ChatML writes it
# as one more user turn after any other role), so a head shares the KV-cache prefix of the
# main prompt up to the end of that message's text. The wording matches what
# callgate.serving.quick.service reads and constrains: `action` one of search / answer, `read_url`
# one "URL: yes|no" line per URL of the last user message, `authority` / `domain` one word
# (the grammar holds it to the server's label set), `query` lines, `title` one line.
TEXT_QUICK_TASKS: Mapping[str, str] = _frozen(
    {
        "action": "Decide whether answering the conversation above needs a web search. "
        "Reply with exactly one word: search or answer.",
        "query": "Write the web search queries that would best answer the conversation above, one per line.",
        "authority": "Say how authoritative the sources for the conversation above must be. "
        "Reply with exactly one word: low, medium or high.",
        "domain": "Name the subject domain of the conversation above in one word.",
        "title": "Write a short title (at most eight words) for the conversation above, on one line.",
        "read_url": "For each URL in the last user message, write one line: the URL, a colon and a space, "
        "then yes if it should be opened and read, otherwise no.",
    }
)

# =========================================================================================
# qwen3-xml (Qwen3-Coder) -- owned by the qwen3-xml work; see golden/qwen3-xml/FORMAT.md
# =========================================================================================

# The call layout (FORMAT.md section 4), spelled with these markers and "\n" separators:
#   <tool_call>\n<function=NAME>\n  (<parameter=P>\nVALUE\n</parameter>\n)*  </function>\n</tool_call>
# Values carry no type marker: they are typed by the declared JSON schema of the parameter.
# <think> / </think> are read by the parser only (a leading reasoning block, as other
# families that share this syntax write it); the Qwen3-Coder template has no reasoning.
QWEN3_XML = ToolCallFormat(
    name="qwen3-xml",
    family="qwen3-xml",
    framing="chatml-qwen3-coder",
    argument_encoding="schema-typed-text",
    bos="",
    eos="<|im_end|>",
    call_trigger="<tool_call>",
    reasoning_open=None,
    reasoning_close=None,
    markers=_frozen(
        {
            "turn_open": "<|im_start|>",
            "turn_close": "<|im_end|>",
            "call_open": "<tool_call>",
            "call_close": "</tool_call>",
            "function_open": "<function=",
            "function_close": "</function>",
            "parameter_open": "<parameter=",
            "parameter_close": "</parameter>",
            "tag_end": ">",
            "separator": "\n",
            "result_open": "<tool_response>",
            "result_close": "</tool_response>",
            "think_open": "<think>",
            "think_close": "</think>",
        }
    ),
    special_tokens=(
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ),
    # Qwen3-Coder has no task tokens: a quick head is a plain instruction appended to the
    # last user turn, so the prompt up to the user text is shared with the main request.
    quick_tasks=TEXT_QUICK_TASKS,
)

# =========================================================================================
# hermes (ChatML: Qwen3, Qwen2.5, Hermes, SmolLM) -- owned by the JSON-family work
# =========================================================================================

# Call layout (golden/hermes/FORMAT.md sections 5 and 8), spelled with these markers:
#   CONTENT ["\n" <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>]* <|im_end|>
# calls are separated by exactly call_separator; the body is one strict JSON object with
# exactly the keys name_key and arguments_key. Tool results go back in a user turn as
# <tool_response>\nRESULT\n</tool_response>. The long system-prompt texts below are the
# Qwen3 / Qwen2.5 templates' own (golden/hermes/fixed_texts.json).
_HERMES_CALL_OPEN = "<tool_call>"
_HERMES_CALL_CLOSE = "</tool_call>"
_HERMES_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    f"{_HERMES_CALL_OPEN}{_HERMES_CALL_CLOSE} XML tags:\n{_HERMES_CALL_OPEN}\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    f"{_HERMES_CALL_CLOSE}"
)

HERMES = ToolCallFormat(
    name="hermes",
    family="json",
    framing="chatml-qwen3",
    argument_encoding="json",
    bos="",
    eos="<|im_end|>",
    call_trigger=_HERMES_CALL_OPEN,
    reasoning_open="<think>",
    reasoning_close="</think>",
    markers=_frozen(
        {
            # parser + renderer
            "call_layout": "object",
            "block_open": _HERMES_CALL_OPEN,
            "block_close": _HERMES_CALL_CLOSE,
            "call_separator": "\n",
            "name_key": "name",
            "arguments_key": "arguments",
            # renderer
            "turn_open": "<|im_start|>",
            "turn_close": "<|im_end|>",
            "result_open": "<tool_response>",
            "result_close": "</tool_response>",
            "tools_open": "<tools>",
            "tools_close": "</tools>",
            "tools_intro": _HERMES_TOOLS_INTRO,
            "tools_outro": _HERMES_TOOLS_OUTRO,
            # Qwen2.5 variant: a default system prompt, and the tools text after a blank line
            "qwen25_default_system": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        }
    ),
    special_tokens=(
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        _HERMES_CALL_OPEN,
        _HERMES_CALL_CLOSE,
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ),
    # No task tokens in ChatML: a quick head is one more user turn holding the instruction,
    # so the conversation before it is byte-identical to the main prompt.
    quick_tasks=TEXT_QUICK_TASKS,
)

# The same calls under the Qwen2.5-Instruct framing (Qwen2.5, Qwen2.5-Coder): the template
# writes a default system prompt when the conversation has none, and has no reasoning
# block, so `<think>` is plain text for these models (neither reasoning nor a tag).
HERMES_QWEN25 = dataclasses.replace(
    HERMES,
    name="hermes-qwen2.5",
    framing="chatml-qwen2.5",
    reasoning_open=None,
    reasoning_close=None,
    special_tokens=tuple(t for t in HERMES.special_tokens if t not in ("<think>", "</think>")),
)

# =========================================================================================
# llama3-json (Llama 3.1, 3.2) -- owned by the JSON-family work
# =========================================================================================


# Llama 3.1 tokenizer control tokens: the named ones and <|reserved_special_token_0..247|>.
_LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(248)),
)

# Renderer markers (golden/llama3-json/FORMAT.md sections 1-5, fixed_texts.json). A turn is
# header_open ROLE header_close TEXT end_of_turn; a call turn's TEXT is
# call_open NAME call_parameters json.dumps(arguments) call_close. Tools are
# json.dumps(tool, indent=tools_indent) + tool_separator each, after the prefix of
# `tools_position` ("user": first user message, the template default; "system").
LLAMA3_JSON = ToolCallFormat(
    name="llama3-json",
    family="json",
    framing="llama3.1",
    argument_encoding="json",
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    call_trigger='{"name"',
    reasoning_open=None,
    reasoning_close=None,
    markers=_frozen(
        {
            "header_open": "<|start_header_id|>",
            "header_close": "<|end_header_id|>\n\n",
            "end_of_turn": "<|eot_id|>",
            "end_of_message": "<|eom_id|>",
            "python_tag": "<|python_tag|>",
            "tool_role": "ipython",
            "call_open": '{"name": "',
            "call_parameters": '", "parameters": ',
            "call_close": "}",
            "environment_line": "Environment: ipython\n",
            "knowledge_line": "Cutting Knowledge Date: December 2023\n",
            "date_prefix": "Today Date: ",
            "date_suffix": "\n\n",
            "today_date": "26 Jul 2024",
            "tools_position": "user",
            "tools_indent": "4",
            "tool_separator": "\n\n",
            "tools_in_user_prefix": "Given the following functions, please respond with a JSON for a function call "
            "with its proper arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
            "Do not use variables.\n\n",
            "tools_in_system_prefix": "You have access to the following functions. To call a function, please "
            "respond with JSON for a function call."
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
            "Do not use variables.\n\n",
            "quick_task_join": "\n\n",
            # parser (JSON family): one bare call object, optionally after python_tag
            "call_layout": "single",
            "name_key": "name",
            "arguments_key": "parameters",
            "call_in_text": '{"name":',
        }
    ),
    special_tokens=_LLAMA3_SPECIAL_TOKENS,
    quick_tasks=TEXT_QUICK_TASKS,
)

# =========================================================================================
# mistral (mistral-common v3 tekken) -- owned by the mistral work
# =========================================================================================

# mistral-common v3 tekken (golden/mistral/FORMAT.md sections 1-4). Layout:
#   bos, then per turn: user [tools_open JSON tools_close] inst_open TEXT inst_close
#   assistant TEXT eos | calls JSON-list eos ; tool results_open JSON results_close
# Control tokens: the 20 named ones of tekken_240718 plus <SPECIAL_20..999>.
_MISTRAL_SPECIAL_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
    *(f"<SPECIAL_{i}>" for i in range(20, 1000)),
)

MISTRAL = ToolCallFormat(
    name="mistral",
    family="json",
    framing="mistral-v3-tekken",
    argument_encoding="json",
    bos="<s>",
    eos="</s>",
    call_trigger="[TOOL_CALLS]",
    reasoning_open=None,
    reasoning_close=None,
    markers=_frozen(
        {
            "inst_open": "[INST]",
            "inst_close": "[/INST]",
            "tools_open": "[AVAILABLE_TOOLS]",
            "tools_close": "[/AVAILABLE_TOOLS]",
            "results_open": "[TOOL_RESULTS]",
            "results_close": "[/TOOL_RESULTS]",
            "calls": "[TOOL_CALLS]",
            "message_join": "\n\n",
            "call_id_pattern": "[a-zA-Z0-9]{9}",
            "name_pattern": "[a-zA-Z0-9_-]{1,64}",
            "quick_task_join": "\n\n",
            # parser (JSON family): one JSON list of call objects after `calls`
            "call_layout": "list",
            "name_key": "name",
            "arguments_key": "arguments",
            "id_key": "id",
        }
    ),
    special_tokens=_MISTRAL_SPECIAL_TOKENS,
    quick_tasks=TEXT_QUICK_TASKS,
    native_call_ids=True,
)

# =========================================================================================

FORMATS: Mapping[str, ToolCallFormat] = MappingProxyType(
    {f.name: f for f in (DSML_V32, DSML_V4, QWEN3_XML, HERMES, HERMES_QWEN25, LLAMA3_JSON, MISTRAL)}
)


def get_format(name: str) -> ToolCallFormat:
    """The spec for `name`; raises KeyError naming the known formats."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known: {', '.join(FORMATS)}") from None
