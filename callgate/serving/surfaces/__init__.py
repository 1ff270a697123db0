"""The wire surfaces: OpenAI chat completions, legacy completions, Responses and /v1/quick
(protocol*, chat_completions, completions, responses_*, routes) and Anthropic Messages
(anthropic_*), with their SSE framing (sse). Each turns its wire body into the internal
request and renders one turn's events (serving/turn_events.py) in its own shape."""
