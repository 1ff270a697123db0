"""Shared test fixtures: paths to the golden data copied under tests/data/golden."""

from __future__ import annotations

import json
import os
from pathlib import Path
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
