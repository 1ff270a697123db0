"""bench_parse_errors' workload: single-turn BFCL v4 cases as OpenAI tools and messages.

Knows: where BFCL's data lives (the PyPI wheel `bfcl-eval`, downloaded once with `pip
download --no-deps` into the cache folder), its schema dialect and how it becomes JSON
Schema (`dict` -> object, `float` -> number, `tuple` -> array, `any` -> no type, BFCL's
`optional` dropped, `required` limited to declared properties; nothing else loosened),
dotted names made legal (`.` -> `_`), the seeded pick (about half `simple_python`, 30 %
`multiple`, 20 % `parallel`) and the tool_choice of each mode. Does not know: engines,
parsers or scoring.

    load_cases(n, cache) -> list[Case]; load_irrelevance(n, cache) -> list[Case]
    make_case(row, truth) -> Case; convert(bfcl_schema) -> JSON Schema
    runs(mode, case) -> bool; tool_choice(mode, case) -> OpenAI tool_choice
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bfcl_answers import GroundTruth, irrelevance_rows

SEED = 0
CATEGORIES = (("simple_python", 0.5), ("multiple", 0.3), ("parallel", 0.2))
TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "str": "string", "int": "integer", "bool": "boolean"}
IRRELEVANCE_MODES = frozenset({"unconstrained", "control", "auto"})  # a forced call cannot be the right answer


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    expected: frozenset[str]  # ground-truth function names (legal spelling)
    named: str  # the function a `named` tool_choice asks for: BFCL's first ground-truth call
    truth: GroundTruth = ()  # BFCL's possible answers (benchmarks/bfcl_answers.py)
    kind: str = "call"  # "call" | "irrelevance" (the right answer is no call)


def bfcl_wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("bfcl_eval-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "bfcl-eval", "-d", str(cache), "-q"]
        subprocess.run(cmd, check=True)
        found = sorted(cache.glob("bfcl_eval-*.whl"))
    return found[-1]


def legal(name: str) -> str:
    return name.replace(".", "_")


def convert(schema: Any) -> Any:
    """BFCL's schema dialect -> JSON Schema (nothing loosened)."""
    if isinstance(schema, list):
        return [convert(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "optional":
            continue
        if key == "type":
            if value == "any":
                continue
            out[key] = TYPE_MAP.get(value, value)
        elif key == "properties":
            out[key] = {k: convert(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = convert(value)
        else:
            out[key] = value
    if "required" in out and isinstance(out.get("properties"), Mapping):
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def bfcl_tool(fn: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": legal(fn["name"]),
            "description": fn.get("description", ""),
            "parameters": convert(fn["parameters"]),
        },
    }


def make_case(row: Mapping[str, Any], truth: Sequence[Mapping[str, Any]]) -> Case:
    """One BFCL row and its ground truth (a list of {function name: arguments})."""
    tools = tuple(map(bfcl_tool, row["function"]))
    names = [legal(name) for call in truth for name in call]
    named = names[0] if names else tools[0]["function"]["name"]
    return Case(row["id"], tuple(row["question"][0]), tools, frozenset(names), named, tuple(truth))


def load_cases(n: int, cache: Path) -> list[Case]:
    wheel = zipfile.ZipFile(bfcl_wheel(cache))
    rng = random.Random(SEED)
    cases: list[Case] = []
    for category, share in CATEGORIES:
        rows = wheel.read(f"bfcl_eval/data/BFCL_v4_{category}.json").decode().splitlines()
        answers = wheel.read(f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json").decode().splitlines()
        truth = {a["id"]: a["ground_truth"] for a in map(json.loads, answers)}
        picked = rng.sample(rows, min(len(rows), round(n * share)))
        cases.extend(make_case(row, truth.get(row["id"], [])) for row in map(json.loads, picked))
    return cases[:n]


def load_irrelevance(n: int, cache: Path) -> list[Case]:
    """`n` seeded BFCL irrelevance cases (no ground truth: the right answer is no call)."""
    rows = irrelevance_rows(bfcl_wheel(cache), n, SEED)
    return [
        Case(r["id"], tuple(r["question"][0]), tools, frozenset(), tools[0]["function"]["name"], (), "irrelevance")
        for r in rows
        for tools in [tuple(map(bfcl_tool, r["function"]))]
    ]


def runs(mode: str, case: Case) -> bool:
    """Whether `case` runs under `mode` (irrelevance cases only where no call is forced)."""
    return case.kind == "call" or mode in IRRELEVANCE_MODES


def tool_choice(mode: str, case: Case) -> Any:
    """The OpenAI tool_choice of a mode (`named`: BFCL's first expected function)."""
    if mode == "named":
        return {"type": "function", "function": {"name": case.named}}
    return mode
