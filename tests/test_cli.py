"""The command line: flags -> one frozen Settings; help explains every flag."""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from callgate.__main__ import build_parser, main, settings_from_args
from callgate.serving.engines.vllm_engine import environment
from callgate.serving.settings import Settings


def _settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_serve_without_arguments_is_the_embedded_model_in_hermes_on_loopback() -> None:
    s = _settings()
    assert (s.model, s.format, s.host, s.port) == (None, "hermes", "127.0.0.1", 8000)
    assert s.model_name == "smollm2-135m-instruct"
    assert s.api_key is None and s.max_repairs == 1 and s.trust_actor_header is False and s.recover_calls
    assert _settings("--trust-actor-header").trust_actor_header is True
    assert not _settings("--no-recover-calls").recover_calls
    assert _settings("--model", "embedded:smollm2-135m-instruct").model_name == "smollm2-135m-instruct"


def test_flags_reach_settings() -> None:
    s = _settings(
        "--model", "/models/qwen", "--served-model-name", "q", "--format", "qwen3-xml", "--host", "0.0.0.0",
        "--port", "9001", "--api-key", "k", "--max-num-seqs", "4", "--max-model-len", "1024", "--max-queue", "2",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "3", "--dtype", "bfloat16", "--kv-cache-space", "3",
        "--validator-url", "http://127.0.0.1:9/v", "--max-repairs", "2", "--audit-log", "/tmp/a.jsonl",
        "--max-body-bytes", "1000", "--max-tools", "3", "--max-schema-depth", "4", "--max-tokens-limit", "50",
        "--max-stop-sequences", "1", "--cpu-threads", "2", "--responses-store-max", "7",
        "--responses-store-max-bytes", "4096",
    )  # fmt: skip
    assert (s.model, s.model_name, s.format, s.host, s.port) == ("/models/qwen", "q", "qwen3-xml", "0.0.0.0", 9001)
    assert (s.api_key, s.max_num_seqs, s.max_model_len, s.max_queue, s.max_in_flight) == ("k", 4, 1024, 2, 6)
    assert (s.engine.tensor_parallel_size, s.engine.pipeline_parallel_size, s.engine.dtype) == (2, 3, "bfloat16")
    assert (s.validator_url, s.max_repairs, s.audit_log) == ("http://127.0.0.1:9/v", 2, "/tmp/a.jsonl")
    assert (s.responses_store_max, s.responses_store_max_bytes) == (7, 4096)
    lim = s.limits
    assert (lim.max_body_bytes, lim.max_tools, lim.max_schema_depth, lim.max_tokens, lim.max_stop_sequences) == (
        1000,
        3,
        4,
        50,
        1,
    )
    env = environment(s.engine_config("/models/qwen"))  # what VllmEngine.start applies
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and env["OMP_NUM_THREADS"] == "2"
    cfg = s.engine_config("/models/qwen")
    assert (cfg.model, cfg.served_model_name, cfg.max_num_seqs, cfg.tensor_parallel_size) == ("/models/qwen", "q", 4, 2)


def test_settings_are_frozen_and_hide_the_key() -> None:
    s = _settings("--api-key", "sekrit")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]
    assert "sekrit" not in repr(s)


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLGATE_API_KEY", "from-env")
    assert _settings().api_key == "from-env"
    assert _settings("--api-key", "flag").api_key == "flag"


def test_bad_values_exit() -> None:
    with pytest.raises(SystemExit):
        _settings("--port", "0")
    with pytest.raises(SystemExit):
        _settings("--format", "klingon")
    with pytest.raises(SystemExit):
        _settings("--max-num-seqs", "many")


def test_help_explains_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "callgate", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    for action in serve._actions:
        for flag in action.option_strings:
            assert flag in out
        assert action.help, f"{action.option_strings} has no help"
    top = subprocess.run(
        [sys.executable, "-m", "callgate", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "serve" in top and "bench" in top


def test_bench_lists_choices_for_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no-such-benchmark"]) == 2
    assert "choose one of" in capsys.readouterr().err


def test_serve_runs_the_app_with_a_scripted_engine(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["Hello from the CLI."]), encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "callgate", "serve", "--engine", "fake", "--fake-script", str(script)]
    cmd += ["--port", str(port), "--api-key", "cli-key", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
                time.sleep(0.1)
        auth = {"Authorization": "Bearer cli-key"}
        body = {"messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=10).status_code == 401
        for _ in range(2):  # the last scripted reply repeats
            resp = httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=10)
            assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "Hello from the CLI."
        assert resp.json()["model"] == "smollm2-135m-instruct"
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode in (0, -signal.SIGTERM), output  # uvicorn re-raises the signal after a clean shutdown
    assert "Traceback" not in output
    assert "cli-key" not in output


def test_the_real_engine_gets_the_resolved_folder_config_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from callgate.__main__ import build_vllm_engine
    from callgate.serving.engines import model_store, vllm_engine

    seen: dict[str, Any] = {}
    monkeypatch.setattr(model_store, "resolve_model", lambda model: seen.setdefault("model", model) and tmp_path)
    monkeypatch.setattr(
        vllm_engine.VllmEngine, "start", classmethod(lambda cls, config, env=None: seen.update(config=config, env=env))
    )
    build_vllm_engine(_settings("--max-model-len", "1024", "--kv-cache-space", "2", "--cpu-threads", "2"))
    assert seen["model"] == model_store.EMBEDDED_MODEL
    config, env = seen["config"], seen["env"]
    assert (config.model, config.served_model_name, config.max_model_len) == (
        str(tmp_path),
        "smollm2-135m-instruct",
        1024,
    )
    assert env is None  # start applies vllm_engine.environment(config), from the same config
    assert vllm_engine.environment(config) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": "2",
    }


def test_readme_configuration_lists_every_serve_flag() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {f for a in serve._actions for f in a.option_strings if f.startswith("--") and f != "--help"}
    missing = sorted(f for f in flags if f"`{f}" not in section)
    assert not missing, f"README Configuration does not describe {missing}"


def test_the_format_comes_from_the_model_folder_unless_given(tmp_path: Path) -> None:
    from callgate.__main__ import with_model_format

    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    template = (
        "{%- if tools %}You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<tool_call>{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}), encoding="utf-8")
    assert build_parser().parse_args(["serve", "--model", str(tmp_path)]).format is None  # not given
    assert with_model_format(_settings("--model", str(tmp_path))).format == "hermes-qwen2.5"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "plain"}), encoding="utf-8")
    assert with_model_format(_settings("--model", str(tmp_path))).format == "hermes"  # nothing implied


def test_prepare_model_prints_the_prepared_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from callgate.serving.engines import model_asset

    seen: list[Any] = []
    monkeypatch.setattr(model_asset, "prepare", lambda asset, cache, wheels: seen.append((asset, cache)) or tmp_path)
    assert main(["prepare-model", "qwen2.5-coder-0.5b", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)
    assert seen == [(model_asset.QWEN25_CODER_05B, tmp_path)]
