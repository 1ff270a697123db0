"""Per-step constrained decoding inside the engine: the logits processor over llguidance
matchers (processor.py), each request's row (rows.py), budget closing (budget.py, planned by
closing.py, marked by closing_marks.py) and the mask timings (timings.py, step_log.py).
Imports no vllm and nothing of callgate.serving: the engine module mixes
`processor.ConstrainedBatch` with vLLM's base class and supplies the model's vocabulary."""
