"""Shared test fixtures: paths to the golden data copied under tests/data/golden, and a
loader for the benchmark scripts whose pure helpers have tests."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import settings

# CI runs each property test on the same examples every time (a submission lands or not on
# its own merit, not on a draw); local runs keep exploring with fresh random examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

GOLDEN = Path(__file__).parent / "data" / "golden"


def load_jsonl(relpath: str) -> list[dict[str, Any]]:
    """Cases of one golden JSONL file (relative to tests/data/golden)."""
    with open(GOLDEN / relpath, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (the scripts are not a package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module
