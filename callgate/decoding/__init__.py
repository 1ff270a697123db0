"""Per-step constrained decoding inside the engine: the logits processor over llguidance
matchers (processor.py), budget closing (closing.py). Imports no vllm: the engine module
mixes `processor.ConstrainedBatch` with vLLM's base class."""
