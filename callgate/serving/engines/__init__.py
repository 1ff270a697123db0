"""The engines behind the `Engine` seam (engine.py): vLLM (vllm_engine.py, the only module
importing vllm), the scripted FakeEngine for hermetic tests (fake_engine.py), where the
model's files come from (model_store.py, model_asset.py) and its tokenizer (tokenizer.py)."""
