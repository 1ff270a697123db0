"""Which requests budget closing cut short: one empty file per request in a folder.

Knows: the folder the server names in the engine's environment (`CALLGATE_CLOSING_DIR`),
readable from vLLM's engine-core process as from the server's. Does not know: grammars.

    mark(directory, request_id)    # the processor: this request's output was closed by plan
    take(directory, request_id)    # the server, once the generation ended: was it? (removes it)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ENV = "CALLGATE_CLOSING_DIR"


def _path(directory: str, request_id: str) -> Path:
    return Path(directory) / hashlib.sha256(request_id.encode()).hexdigest()[:32]


def mark(directory: str, request_id: str) -> None:
    try:
        _path(directory, request_id).touch()
    except OSError:  # a lost mark loses a `truncated` flag, never the output
        pass


def take(directory: str | None, request_id: str) -> bool:
    if not directory:
        return False
    path = _path(directory, request_id)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError:
        return False
    return True
