"""The OpenAI Agents SDK (its default model: the Responses API) running a tool-using agent
against a real callgate server on a scripted FakeEngine, plain and streamed.

`openai-agents` pins `websockets<17`, which would downgrade the server's environment, so the
agent runs in its own environment (`.venv-agents`, made by scripts/install.sh) as a child
process (tests/agents_client.py) against the server's URL; where that environment is
missing (an install without it) the test is skipped."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import test_server_openai
from tests.test_server_app import MODEL, call_text
from tests.test_server_openai import Server

ROOT = Path(__file__).resolve().parent.parent
AGENTS_PYTHON = ROOT / ".venv-agents" / "bin" / "python"
CLIENT = Path(__file__).with_name("agents_client.py")

serve = test_server_openai.serve  # the real-server fixture


def test_an_agent_calls_its_function_tool_and_answers(serve: Callable[..., Server]) -> None:
    if not AGENTS_PYTHON.exists():
        pytest.skip("no .venv-agents (scripts/install.sh makes it)")
    replies = [
        call_text("get_weather", {"city": "Oslo"}),
        "Oslo is at -3 C.",
        call_text("get_weather", {"city": "Bergen"}),
        "Bergen is at 2 C.",
    ]
    server = serve(replies=replies)
    done = subprocess.run(
        [str(AGENTS_PYTHON), str(CLIENT), server.url, MODEL], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["plain"], out["streamed"]) == ("Oslo is at -3 C.", "Bergen is at 2 C.")
    assert out["seen"] == ["Oslo", "Bergen"]
    assert "raw_response_event" in out["kinds"] and "run_item_stream_event" in out["kinds"]
    prompts = [r.prompt for r in server.engine.requests]
    assert "Oslo: cold" in prompts[1] and "Bergen: cold" in prompts[3]
