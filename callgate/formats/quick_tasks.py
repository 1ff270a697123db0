"""The quick-instruction heads of every format without task tokens (all but dsml-v4).

Knows: the instruction text of each head. A head is that text appended to the last user
message (after a blank line; ChatML writes it as one more user turn after any other role),
so a head shares the KV-cache prefix of the main prompt up to the end of that message's
text. The wording matches what callgate.serving.quick reads and constrains: `action` one of
search / answer, `read_url` one "URL: yes|no" line per URL of the last user message,
`authority` / `domain` one word (the grammar holds it to the server's label set), `query`
lines, `title` one line. Does not know: how a template appends it.
"""

from __future__ import annotations

from collections.abc import Mapping

from callgate.formats.spec import frozen

TEXT_QUICK_TASKS: Mapping[str, str] = frozen(
    {
        "action": "Decide whether answering the conversation above needs a web search. "
        "Reply with exactly one word: search or answer.",
        "query": "Write the web search queries that would best answer the conversation above, one per line.",
        "authority": "Say how authoritative the sources for the conversation above must be. "
        "Reply with exactly one word: low, medium or high.",
        "domain": "Name the subject domain of the conversation above in one word.",
        "title": "Write a short title (at most eight words) for the conversation above, on one line.",
        "read_url": "For each URL in the last user message, write one line: the URL, a colon and a space, "
        "then yes if it should be opened and read, otherwise no.",
    }
)
