"""bench_compile's workload: the tool sets and what each mode asks.

    ToolSet(name, samples)                 # repeats cycle through the samples
    tool_sets(names, bfcl_cases) -> list[ToolSet]
    renamed(tools, suffix)                 # a fresh cache key for the same tools
    call_schema(tools)                     # the calls as one JSON schema (the peers' input)
    request_args(mode, tools)              # (tools, tool_choice, parallel, response_format)

Tool sets: `agent-12` (/work/shared/bench/agent_tools.json), `bfcl-multiple` and
`bfcl-parallel` (the tools of `bfcl_cases` BFCL v4 cases each, seed 0, converted by
bench_parse_errors' loader), `64-tools` (the first 64 distinct BFCL functions of the
multiple, parallel and simple_python files, renamed unique).
"""

from __future__ import annotations

import json
import random
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMATS = ("hermes", "qwen3-xml", "dsml-v3.2", "dsml-v4", "llama3-json", "mistral")
TOOL_SETS = ("agent-12", "bfcl-multiple", "bfcl-parallel", "64-tools")
AGENT_TOOLS = Path("/work/shared/bench/agent_tools.json")
BFCL_CACHE = Path.home() / ".cache" / "callgate" / "bfcl"
SEED = 0


@dataclass(frozen=True, slots=True)
class ToolSet:
    """A named tool set; `samples` are the tool lists its repeats cycle through."""

    name: str
    samples: tuple[tuple[Mapping[str, Any], ...], ...]

    def sample(self, r: int) -> tuple[Mapping[str, Any], ...]:
        return self.samples[r % len(self.samples)]


def renamed(tools: Sequence[Mapping[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """`tools` with `suffix` appended to every function name (a fresh cache key)."""
    return [{**t, "function": {**t["function"], "name": t["function"]["name"] + suffix}} for t in tools]


def call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The calls as one JSON schema: anyOf of {name: const, arguments: parameters}."""
    branches = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def request_args(mode: str, tools: Sequence[Mapping[str, Any]]) -> tuple[Any, Any, Any, Any]:
    """(tools, tool_choice, parallel_tool_calls, response_format) of a mode."""
    if mode == "response_format":
        return None, None, None, {"type": "json_schema", "json_schema": {"name": "calls", "schema": call_schema(tools)}}
    if mode == "named":
        return tools, {"type": "function", "function": {"name": tools[0]["function"]["name"]}}, None, None
    return tools, mode, None, None


def _bfcl_rows(wheel: zipfile.ZipFile, category: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in wheel.read(f"bfcl_eval/data/BFCL_v4_{category}.json").decode().splitlines()]


def tool_sets(names: Sequence[str], bfcl_cases: int, cache: Path = BFCL_CACHE) -> list[ToolSet]:
    out: list[ToolSet] = []
    if "agent-12" in names:
        out.append(ToolSet("agent-12", (tuple(json.loads(AGENT_TOOLS.read_text())),)))
    bfcl = [n for n in names if n != "agent-12"]
    if not bfcl:
        return out
    from bfcl_cases import bfcl_wheel, make_case

    wheel = zipfile.ZipFile(bfcl_wheel(cache))
    rng = random.Random(SEED)
    for category in ("multiple", "parallel"):
        if f"bfcl-{category}" in names:
            rows = rng.sample(_bfcl_rows(wheel, category), bfcl_cases)
            out.append(ToolSet(f"bfcl-{category}", tuple(make_case(row, []).tools for row in rows)))
    if "64-tools" in names:
        seen: dict[str, Mapping[str, Any]] = {}
        for category in ("multiple", "parallel", "simple_python"):
            for row in _bfcl_rows(wheel, category):
                for tool in make_case(row, []).tools:
                    seen.setdefault(tool["function"]["name"], tool)
        picked = list(seen.values())[:64]
        out.append(ToolSet("64-tools", (tuple(renamed(picked[i : i + 1], f"_{i}")[0] for i in range(len(picked))),)))
    return [t for name in names for t in out if t.name == name]
