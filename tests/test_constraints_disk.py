"""The Index cache's disk tier: files written by the server, loaded by the engine process.

A grammar loaded from a file is told apart from one compiled from the regex by handing
the loader a *different* regex: only the file can make the guide follow the first one."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import outlines_core
import pytest

import callgate.constraints as constraints
from callgate.constraints import cache
from callgate.constraints.cache import DiskTier, IndexCache, read_index, token_vocabulary, write_index
from callgate.constraints.processor import ConstrainedBatch, TokenTable, row_spec
from tests.test_constraints import WEATHER, byte_vocabulary

PIECES: dict[bytes, list[int]] = {b"a": [0], b"b": [1], b"c": [2], b"ab": [3], b"ba": [4], b"abc": [5]}
EOS = 6
VOCAB = token_vocabulary(PIECES, EOS)
TABLE = TokenTable.build(PIECES, EOS, {})


def transitions(index: Any) -> dict[int, dict[int, int]]:
    return {int(s): {int(t): int(n) for t, n in moves.items()} for s, moves in index.get_transitions().items()}


def compiled(regex: str) -> Any:
    return outlines_core.Index(regex, VOCAB.inner)


def test_an_index_survives_the_round_trip(tmp_path: Path) -> None:
    index = compiled("(ab|c)+b?")
    path = tmp_path / "one.index"
    size = write_index(path, index)
    assert path.stat().st_size == size
    loaded = read_index(path)
    assert loaded is not None
    assert transitions(loaded) == transitions(index)
    assert loaded.get_final_states() == index.get_final_states()
    assert [p.name for p in tmp_path.iterdir()] == ["one.index"]  # no temp file left behind


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: blob[:-3],  # truncated
        lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]),  # one bit flipped in the payload
        lambda blob: b"not an index" + blob,  # wrong header
        lambda blob: b"",
    ],
)
def test_a_damaged_file_reads_as_missing(tmp_path: Path, damage: Any, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bad.index"
    write_index(path, compiled("a+"))
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level(logging.WARNING, "callgate.constraints.cache"):
        assert read_index(path) is None
    assert str(path) in caplog.text
    assert read_index(tmp_path / "absent.index") is None


def test_the_cache_loads_a_given_file_instead_of_compiling(tmp_path: Path) -> None:
    path = tmp_path / f"{VOCAB.fingerprint}-given.index"
    write_index(path, compiled("(ab)+"))
    index = IndexCache(disk=None).get_or_compile("k", "c+", VOCAB, str(path))
    assert transitions(index) == transitions(compiled("(ab)+"))


def test_a_file_named_for_another_vocabulary_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "0123456789abcdef-given.index"
    write_index(path, compiled("(ab)+"))
    with caplog.at_level(logging.WARNING, "callgate.constraints.cache"):
        index = IndexCache(disk=None).get_or_compile("k", "c+", VOCAB, str(path))
    assert transitions(index) == transitions(compiled("c+"))
    assert "another vocabulary" in caplog.text


def test_a_corrupt_given_file_is_recompiled_from_the_regex_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / f"{VOCAB.fingerprint}-given.index"
    write_index(path, compiled("(ab)+"))
    path.write_bytes(path.read_bytes()[:-1])
    disk = DiskTier(tmp_path / "own")
    with caplog.at_level(logging.WARNING, "callgate.constraints.cache"):
        index = IndexCache(disk=disk).get_or_compile("k", "c+", VOCAB, str(path))
    assert transitions(index) == transitions(compiled("c+"))
    assert "corrupt" in caplog.text and "compiling from the regex" in caplog.text
    assert list((tmp_path / "own").glob("*")) == []  # another process's path: read, never written


def test_a_compile_is_written_once_and_found_again_after_a_restart(tmp_path: Path) -> None:
    first = IndexCache(disk=DiskTier(tmp_path))
    index = first.get_or_compile("key", "(ab|ba)c", VOCAB)
    files = list(tmp_path.glob("*.index"))
    assert [f.name for f in files] == [first.disk.path_for(VOCAB.fingerprint, "key").name]  # type: ignore[union-attr]
    assert files[0].name.startswith(VOCAB.fingerprint + "-")
    restarted = IndexCache(disk=DiskTier(tmp_path))
    assert transitions(restarted.get_or_compile("key", "c+", VOCAB)) == transitions(index)


def test_persisted_rewrites_an_evicted_file(tmp_path: Path) -> None:
    tier = IndexCache(disk=DiskTier(tmp_path))
    index = tier.get_or_compile("key", "a+", VOCAB)
    path = tier.persisted("key", VOCAB, index)
    assert path is not None
    Path(path).unlink()
    assert tier.persisted("key", VOCAB, index) == path
    loaded = read_index(Path(path))
    assert loaded is not None and transitions(loaded) == transitions(index)
    assert IndexCache(disk=None).persisted("key", VOCAB, index) is None


def test_eviction_removes_the_least_recently_used_files_first(tmp_path: Path) -> None:
    indexes = {name: compiled(rx) for name, rx in [("old", "a+"), ("mid", "b+"), ("new", "c+"), ("fresh", "a+")]}
    size = cache.HEADER_BYTES + len(cache.index_bytes(indexes["old"]))
    tier = DiskTier(tmp_path, max_bytes=2 * size + size // 2)
    for age, name in enumerate(["old", "mid", "new"]):
        path = tmp_path / f"{name}.index"
        write_index(path, indexes[name])
        os.utime(path, ns=(10**18 + age * 10**9, 10**18 + age * 10**9))
    cache.touch(tmp_path / "old.index")  # read just now: the most recent
    assert {len(cache.index_bytes(i)) for i in indexes.values()} == {len(cache.index_bytes(indexes["old"]))}
    tier.store(tmp_path / "fresh.index", indexes["fresh"])
    assert sorted(p.name for p in tmp_path.glob("*.index")) == ["fresh.index", "old.index"]
    assert sum(p.stat().st_size for p in tmp_path.glob("*.index")) <= tier.max_bytes


def test_a_file_larger_than_the_bound_is_kept_while_it_is_the_one_just_written(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, max_bytes=1)
    tier.store(tmp_path / "big.index", compiled("a+"))
    assert [p.name for p in tmp_path.glob("*.index")] == ["big.index"]


CHILD = """
import json, sys
import outlines_core
from callgate.constraints.cache import read_index
index = read_index(__import__("pathlib").Path(sys.argv[1]))
moves = {int(s): {int(t): int(n) for t, n in m.items()} for s, m in index.get_transitions().items()}
print(json.dumps({"transitions": moves, "final": sorted(index.get_final_states())}))
"""


def test_another_process_loads_the_file_and_walks_the_same_tokens(tmp_path: Path) -> None:
    index = compiled("(ab|ba)+c?")
    path = tmp_path / "shared.index"
    write_index(path, index)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True, timeout=120
    )
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert {int(s): {int(t): n for t, n in m.items()} for s, m in child["transitions"].items()} == transitions(index)
    assert child["final"] == sorted(index.get_final_states())


TEMP_CHILD = """
from callgate.constraints.cache import DiskTier, token_vocabulary, write_index
import outlines_core
tier = DiskTier()
vocab = token_vocabulary({b"a": [0]}, 1)
path = tier.path_for(vocab.fingerprint, "k")
write_index(path, outlines_core.Index("a+", vocab.inner))
print(tier.directory)
"""


def test_the_default_directory_is_temporary_and_removed_at_exit() -> None:
    done = subprocess.run([sys.executable, "-c", TEMP_CHILD], capture_output=True, text=True, check=True, timeout=120)
    directory = Path(done.stdout.strip().splitlines()[-1])
    assert directory.name.startswith("callgate-grammars-")
    assert not directory.exists()


def test_build_hands_the_file_to_the_processor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constraints.CACHE, "disk", DiskTier(tmp_path, max_bytes=1 << 30))
    vocab = byte_vocabulary()
    c = constraints.build("hermes", [WEATHER], "required", False, None, vocab)
    assert c is not None and c.index_path is not None
    assert c.ref().index_path == c.index_path
    assert Path(c.index_path).parent == tmp_path
    loaded = read_index(Path(c.index_path))
    assert loaded is not None and transitions(loaded) == transitions(c.index)


class TinyBatch(ConstrainedBatch):
    def load_tokens(self) -> TokenTable:
        return TABLE


class Params:
    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra_args = {"callgate": extra}


class Update:
    def __init__(self, added: list[tuple[int, Params, None, list[int]]]) -> None:
        self.batch_size = len(added)
        self.removed: list[int] = []
        self.added = added
        self.moved: list[Any] = []


def test_the_processor_follows_the_file_not_the_regex(tmp_path: Path) -> None:
    path = tmp_path / f"{TABLE.vocabulary.fingerprint}-from-server.index"
    write_index(path, outlines_core.Index("(ab)+", TABLE.vocabulary.inner))
    batch = TinyBatch(None, "cpu", False)
    key = f"disk-test:{tmp_path}"  # unique: nothing in this process's memory cache
    batch.update_state(Update([(0, Params({"key": key, "regex": "c+", "index_path": str(path)}), None, [])]))
    guide = batch.rows[0].guide
    assert sorted(guide.get_tokens()) == [0, 3]  # "a", "ab": the file's grammar; "c+" would allow 2


def test_index_path_must_be_a_string() -> None:
    assert row_spec({"callgate": {"key": "k", "regex": "a", "index_path": "/x"}}).index_path == "/x"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="index_path"):
        row_spec({"callgate": {"key": "k", "regex": "a", "index_path": 3}})
