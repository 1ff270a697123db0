"""BFCL's possible answers, and its irrelevance cases, for the parse-error benchmark.

Knows: BFCL's ground-truth shape (a list of calls, each `{function name: {parameter: [the
values that count as right]}}`, where `""` in a list means the parameter may be left
out), how a set of tool-call candidates is scored against it (every expected call matched
by one candidate of that function, in any order, with no other candidate; each given
argument one of the possible values; each parameter whose list lacks `""` given), and the
`irrelevance` category (tools that do not fit the question: the right answer is no call).
Does not know: engines, servers, the table.

Value comparison is BFCL's in spirit, simplified: strings are compared after lower-casing
and dropping spaces and the punctuation `,./-_*^` (BFCL's `standardize_string`), an
integer counts for a float, lists compare element-wise and objects key-wise by the same
rules. A dotted BFCL function name is compared in its legal spelling (`.` -> `_`).
"""

from __future__ import annotations

import json
import random
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

GroundTruth = tuple[Mapping[str, Mapping[str, Sequence[Any]]], ...]
_DROPPED = re.compile(r"[ ,./\-_*^]")


def legal(name: str) -> str:
    return name.replace(".", "_")


def _norm_str(s: str) -> str:
    return _DROPPED.sub("", s).lower()


def same_value(got: Any, want: Any) -> bool:
    """One argument value against one possible value."""
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want or (isinstance(got, bool) and isinstance(want, bool) and got == want)
    if isinstance(want, float) and isinstance(got, int | float):
        return float(got) == want
    if isinstance(want, int) and isinstance(got, int | float):
        return got == want
    if isinstance(want, str) and isinstance(got, str):
        return _norm_str(got) == _norm_str(want)
    if isinstance(want, list | tuple) and isinstance(got, list | tuple):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        return matches_arguments(got, want)
    return bool(got == want)


def matches_arguments(got: Mapping[str, Any], possible: Mapping[str, Any]) -> bool:
    """Arguments against one expected call's `{parameter: [possible values]}`."""
    if any(name not in possible for name in got):
        return False
    for name, values in possible.items():
        options = values if isinstance(values, list) else [values]
        if name not in got:
            if "" not in options:
                return False
            continue
        if not any(same_value(got[name], v) for v in options if v != ""):
            return False
    return True


def matches_ground_truth(calls: Sequence[tuple[str, Mapping[str, Any]]], truth: GroundTruth) -> bool:
    """(name, arguments) calls against BFCL's ground truth: one candidate per expected call,
    any order, nothing extra. An empty ground truth never matches (nothing to score)."""
    if not truth or len(calls) != len(truth):
        return False
    expected = [(legal(name), args) for call in truth for name, args in call.items()]
    left = list(calls)
    for name, possible in expected:
        hit = next((i for i, (n, a) in enumerate(left) if n == name and matches_arguments(a, possible)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def ground_truths(wheel: zipfile.ZipFile, category: str) -> dict[str, GroundTruth]:
    """{case id: ground truth} of one BFCL category."""
    lines = wheel.read(f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json").decode().splitlines()
    return {doc["id"]: tuple(doc["ground_truth"]) for doc in map(json.loads, lines)}


def irrelevance_rows(wheel_path: Path, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` seeded rows of BFCL's irrelevance category (question + tools, no answer)."""
    with zipfile.ZipFile(wheel_path) as wheel:
        rows = wheel.read("bfcl_eval/data/BFCL_v4_irrelevance.json").decode().splitlines()
    picked = random.Random(seed).sample(rows, min(len(rows), n))
    return [json.loads(r) for r in picked]
