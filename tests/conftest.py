"""Shared test fixtures: paths to the golden data copied under tests/data/golden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "data" / "golden"


def load_jsonl(relpath: str) -> list[dict[str, Any]]:
    """Cases of one golden JSONL file (relative to tests/data/golden)."""
    with open(GOLDEN / relpath, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
