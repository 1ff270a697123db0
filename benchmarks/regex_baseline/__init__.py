"""The old regex grammar engine over an outlines-core Index: bench_compile's baseline.

callgate served with it before the llguidance engine (callgate.constraints); it is kept
here, out of the package, only so that benchmarks/compile_baseline.py (bench_compile's "old
outlines-core Index path") measures the same path as before. Nothing in callgate imports it.
Its module docstrings describe it as it was when it served (the server, the processor and
`--grammar-cache-dir` no longer read it).

    grammar.grammar(GrammarRequest) -> Grammar(regex, trigger)   # raises SchemaTooComplexError
    index_size.check_size(regex, vocabulary, param)              # the old size refusal
    cache.compile_index(regex, vocabulary) / cache.CACHE         # outlines-core Index, cached

Modules: grammar (tool_choice modes), json_calls / qwen3_xml / dsml (one per format family),
json_schema (JSON Schema -> regex), json_answer (auto + response_format), values (raw
values), text (regex pieces), free_text (a lazy row's text before its trigger), cache and
index_size (outlines-core). The helpers the llguidance engine shares with it are live modules
of callgate.constraints: param_path, json_lexemes, value_schema, text_markers.

Import it as `regex_baseline` with benchmarks/ on sys.path (the bench scripts) or as
`benchmarks.regex_baseline` from the repository root (tests); its modules import one another
relatively, so both work.
"""
