"""callgate: an OpenAI-compatible sidecar that makes tool calling strict.

The package root imports nothing heavy; each layer (templates, parsers,
constraints, kernels, serving) is imported on demand.
"""

__version__ = "0.1.0"
