"""The place of a schema inside a request, as an OpenAI-style `param`.

Knows: how every 400 names its place (`.name` for a keyword or a property, `[i]` for an
index: `tools[0].function.parameters.properties.x.anyOf[1]`). Does not know: schemas,
grammars or formats; callers pass the parts.

    at(path, *parts) -> str       # `path` followed by `parts`
    tool_param(index) -> str      # the parameter schema of the request's index-th tool
"""

from __future__ import annotations


def at(path: str, *parts: str | int) -> str:
    """`path` followed by `parts` as an OpenAI-style `param`, as every other 400 names its
    place: `.name` for a keyword or a property, `[i]` for an index
    (`tools[0].function.parameters.properties.x.anyOf[1]`)."""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else part)
    return path


def tool_param(index: int) -> str:
    """The `param` of the parameter schema of the request's `index`-th tool."""
    return f"tools[{index}].function.parameters"
