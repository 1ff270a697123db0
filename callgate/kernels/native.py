"""Small C libraries built once per process with the system C compiler, loaded with ctypes.

Knows: where a C compiler lives (`cc`, `gcc` or `clang`, which vLLM's CPU backend needs
anyway for torch.compile) and how to build a shared library from one source string. Does
not know: what the code does; the CPU mask kernel (cpu.py) and budget closing's token walk
(callgate.constraints.walk) bring their own source.

The library is built into a private temporary directory that is removed once it is loaded
(dlopen maps the file; the mapping outlives the directory). `-march=native` is tried first
and dropped when the compiler refuses it.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAG_SETS = (
    ("-O3", "-march=native", "-std=c99", "-fPIC", "-shared"),
    ("-O3", "-std=c99", "-fPIC", "-shared"),
)


class NativeUnavailable(RuntimeError):
    """No C compiler, or the library did not build; the reason is the message."""


@functools.cache
def compile_library(name: str, source: str, flag_sets: tuple[tuple[str, ...], ...] = FLAG_SETS) -> ctypes.CDLL:
    """The library built from `source` (once per (name, source, flag_sets) in this process),
    with the first of `flag_sets` the compiler takes. Raises NativeUnavailable."""
    compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None:
        raise NativeUnavailable("no C compiler (cc, gcc or clang) on PATH")
    with tempfile.TemporaryDirectory(prefix=f"callgate-{name}-") as tmp:
        src, lib = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        src.write_text(source)
        errors = [_build(compiler, flags, src, lib) for flags in flag_sets]
        if not lib.exists():
            raise NativeUnavailable(f"{compiler} failed: {errors[-1]}")
        return ctypes.CDLL(str(lib))


def _build(compiler: str, flags: tuple[str, ...], src: Path, lib: Path) -> str:
    if lib.exists():
        return ""
    done = subprocess.run([compiler, *flags, "-o", str(lib), str(src)], capture_output=True, text=True, check=False)
    return done.stderr.strip()[-500:]
