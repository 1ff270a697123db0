"""Schema coverage (issue #17 item 3): which JSON schemas compile, which are refused and why,
and whether what compiles enforces the schema: callgate's engine beside llguidance's own
JSON-schema path and xgrammar's.

Schemas: every group of JSON-Schema-Test-Suite Draft 2020-12 (scripts/install.sh unpacks
it into .cache/json-schema-test-suite; `--suite DIR`; the `optional/` files are reported
apart), and every distinct BFCL v4 tool schema (the wheel bench_parse_errors downloads;
the categories whose rows declare `function`s, but simple_java and simple_javascript,
whose types are Java's and JavaScript's; converted by bench_parse_errors' loader).

* callgate: `lark_schema.prepare` (a suite schema as a response_format, a tool's parameters
  `object_only`, as the grammars do) + `Builder.json` + `llg.check`; a refusal is grouped by
  the first keyword prepare names, or by llguidance's first error line.
* llguidance: `LLMatcher.grammar_from_json_schema` + `validate_grammar` (its defaults).
* xgrammar 0.2.8: `Grammar.from_json_schema` (compact separators, strict mode).

Enforcement, on the suite (its groups carry test instances): each instance, serialised as
the formats write JSON (`, ` and `: `, no newlines), is offered to every compiled grammar
over a byte vocabulary; `valid admitted` counts valid instances the grammar accepts (a
refused one is text the model could never write), `invalid refused` counts invalid ones it
refuses (an admitted one is left to callgate's validator). Instances JSON cannot spell as
the formats do (1.0, which JSON Schema reads as an integer) count as written.

Prints a table; ends with ONE JSON line.

    python benchmarks/bench_schema_coverage.py [--suite DIR] [--no-instances] [--show 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from vocabularies import byte_vocab  # noqa: E402

SUITES = (ROOT / ".cache" / "json-schema-test-suite", Path("/work/main/.cache/json-schema-test-suite"))
BFCL_SKIP = ("simple_java", "simple_javascript")
ENGINES = ("callgate", "llguidance", "xgrammar")
SEPARATORS = (", ", ": ")


@dataclass(frozen=True, slots=True)
class Item:
    """One schema: its source (`suite`, `suite-optional`, `bfcl`), name, the schema, whether
    it is a tool's parameters, and the suite's instances as (data, valid)."""

    source: str
    name: str
    schema: Any
    tool: bool = False
    tests: tuple[tuple[Any, bool], ...] = field(default=())


def suite_dir(given: str | None) -> Path | None:
    found = [Path(given)] if given else list(SUITES)
    return next((d / "tests" / "draft2020-12" for d in found if (d / "tests" / "draft2020-12").is_dir()), None)


def suite_items(folder: Path) -> Iterator[Item]:
    for path in sorted(folder.rglob("*.json")):
        source = "suite-optional" if "optional" in path.relative_to(folder).parts else "suite"
        for k, group in enumerate(json.loads(path.read_text())):
            tests = tuple((t["data"], bool(t["valid"])) for t in group.get("tests", ()))
            yield Item(source, f"{path.relative_to(folder)}#{k} {group['description']}", group["schema"], False, tests)


def bfcl_items(cache: Path) -> Iterator[Item]:
    from bfcl_cases import bfcl_wheel, make_case

    wheel = zipfile.ZipFile(bfcl_wheel(cache))
    seen: set[str] = set()
    for name in sorted(wheel.namelist()):
        m = re.fullmatch(r"bfcl_eval/data/BFCL_v4_(\w+)\.json", name)
        if not m or m.group(1) in BFCL_SKIP:
            continue
        for line in wheel.read(name).decode().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a file that is not one case per line (format_sensitivity)
            if not isinstance(row.get("function"), list) or not row["function"]:
                continue
            for tool in make_case({**row, "question": [[]]}, []).tools:
                fn = tool["function"]
                key = json.dumps([fn["name"], fn["parameters"]], sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    yield Item("bfcl", f"{m.group(1)}:{fn['name']}", fn["parameters"], True)


# ---- the engines: schema -> a grammar accepting texts, or the reason it has none -----------

Acceptor = Callable[[str], bool]


class Refused(Exception):
    """A schema an engine does not compile; `reason` groups it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _first_line(text: str) -> str:
    """An error's first line as a group: source locations, quoted names and numbers elided."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = re.sub(r"^\[[^\]]*\] \S+:\d+: ", "", line)  # xgrammar's "[time] file.cc:line: "
    line = re.sub(r"^at \d+\(\d+\): failed to compile JSON schema: ", "", line)
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", line) if "Unimplemented keys" not in line else line
    return re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "N", line)[:110]


def callgate_compile(item: Item) -> Acceptor:
    from callgate.constraints import llg
    from callgate.constraints.lark_schema import prepare
    from callgate.constraints.lark_text import Builder
    from callgate.errors import SchemaTooComplexError

    try:
        param = "tools[0].function.parameters" if item.tool else "response_format"
        prepared = prepare(item.schema, param, object_only=item.tool)
    except SchemaTooComplexError as exc:
        named = str(exc).split(": ", 1)[1].split(" (it enforces")[0].split(", ")[0]
        raise Refused(f"keyword {named.rsplit('.', 1)[-1]}") from exc
    except Exception as exc:
        raise Refused(f"crash in prepare: {type(exc).__name__}") from exc
    b = Builder()
    text = b.render(b.json(prepared))
    try:
        llg.check(text, None, param)
    except SchemaTooComplexError as exc:
        raise Refused("llguidance: " + _first_line(str(exc).split("cannot be built: ", 1)[-1])) from exc
    return _llg_acceptor(text)


def llguidance_compile(item: Item) -> Acceptor:
    import llguidance

    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(item.schema))
    except Exception as exc:
        raise Refused(_first_line(str(exc))) from exc
    error = llguidance.LLMatcher.validate_grammar(text, None)
    if error:
        raise Refused(_first_line(error))
    # its default JSON options (flexible whitespace) admit the formats' compact spelling
    return _llg_acceptor(text)


def _llg_acceptor(text: str) -> Acceptor:
    from callgate.constraints import llg

    vocab = byte_vocab()

    def accepts(data: str) -> bool:
        m = llg.matcher(text, vocab.llg)
        raw = data.encode()
        return int(m.try_consume_tokens(list(raw))) == len(raw) and bool(m.consume_token(vocab.eos))

    return accepts


def xgrammar_compile(item: Item) -> Acceptor:
    import xgrammar

    try:
        with _quiet_stderr():  # its converter logs a warning per keyword it approximates
            grammar = xgrammar.Grammar.from_json_schema(
                json.dumps(item.schema), any_whitespace=False, separators=SEPARATORS
            )
            compiled = _xgrammar_compiler().compile_grammar(grammar)
    except Exception as exc:
        raise Refused(_first_line(str(exc))) from exc

    def accepts(data: str) -> bool:
        m = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return bool(m.accept_string(data)) and bool(m.is_completed())

    return accepts


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


_XG: list[Any] = []


def _xgrammar_compiler() -> Any:
    if not _XG:
        import xgrammar

        _XG.append(xgrammar.GrammarCompiler(byte_vocab().xgrammar(), max_threads=2))
    return _XG[0]


COMPILERS: dict[str, Callable[[Item], Acceptor]] = {
    "callgate": callgate_compile,
    "llguidance": llguidance_compile,
    "xgrammar": xgrammar_compile,
}


def spelled(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=SEPARATORS)


def cover(items: Sequence[Item], engines: Sequence[str] = ENGINES, instances: bool = True) -> dict[str, Any]:
    """Per source and engine: compiled / refused counts, refusal reasons (most frequent
    first), and on compiled suite groups the instances admitted and refused."""
    out: dict[str, Any] = {}
    for source in dict.fromkeys(i.source for i in items):
        mine = [i for i in items if i.source == source]
        out[source] = {"schemas": len(mine)}
        for engine in engines:
            out[source][engine] = _cover_one(mine, COMPILERS[engine], instances)
    return out


def _cover_one(items: Sequence[Item], compile_: Callable[[Item], Acceptor], instances: bool) -> dict[str, Any]:
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    counts = Counter[str]()
    wrong: dict[str, Counter[str]] = {"valid_refused": Counter(), "invalid_admitted": Counter()}
    for item in items:
        try:
            accepts = compile_(item)
        except Refused as exc:
            reasons[exc.reason] += 1
            examples.setdefault(exc.reason, item.name)
            continue
        counts["compiled"] += 1
        if not instances:
            continue
        for data, valid in item.tests:
            try:
                taken = accepts(spelled(data))
            except Exception:
                taken = False
            counts["valid" if valid else "invalid"] += 1
            counts[_verdict(valid, taken)] += 1
            if taken != valid:
                wrong[_verdict(valid, taken)][item.name.split("#")[0]] += 1
    return {
        "compiled": counts["compiled"],
        "refused": sum(reasons.values()),
        "reasons": [{"reason": r, "count": n, "example": examples[r]} for r, n in reasons.most_common()],
        **({k: counts[k] for k in ("valid", "valid_admitted", "invalid", "invalid_refused")} if instances else {}),
        **({f"{k}_by_file": dict(v.most_common()) for k, v in wrong.items()} if instances else {}),
    }


def _verdict(valid: bool, taken: bool) -> str:
    if valid:
        return "valid_admitted" if taken else "valid_refused"
    return "invalid_admitted" if taken else "invalid_refused"


def table(doc: Mapping[str, Any], show: int = 8) -> str:
    lines = [
        "| schemas | n | engine | compile | refused | valid admitted | invalid refused |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    notes: list[str] = []
    for source, row in doc["coverage"].items():
        for engine in ENGINES:
            r = row.get(engine)
            if r is None:
                continue
            admitted = f"{r['valid_admitted']}/{r['valid']}" if r.get("valid") else "-"
            refused = f"{r['invalid_refused']}/{r['invalid']}" if r.get("invalid") else "-"
            counts = f"{r['compiled']} | {r['refused']} | {admitted} | {refused}"
            lines.append(f"| {source} | {row['schemas']} | {engine} | {counts} |")
            top = ", ".join(f"{x['reason']} ({x['count']})" for x in r["reasons"][:show])
            if top:
                notes.append(f"  {source} / {engine} refused: {top}")
            for key in ("valid_refused_by_file", "invalid_admitted_by_file"):
                files = ", ".join(f"{f} ({n})" for f, n in list(r.get(key, {}).items())[:show])
                if files:
                    notes.append(f"  {source} / {engine} {key.removesuffix('_by_file').replace('_', ' ')}: {files}")
    return "\n".join([*lines, "", *notes])


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--suite", default=None)
    p.add_argument("--bfcl-cache", default=str(Path.home() / ".cache" / "callgate" / "bfcl"))
    p.add_argument("--no-instances", dest="instances", action="store_false")
    p.add_argument("--show", type=int, default=8)
    args = p.parse_args(argv)
    folder = suite_dir(args.suite)
    items = list(suite_items(folder)) if folder else []
    if folder is None:
        print("JSON-Schema-Test-Suite not found (run scripts/install.sh); BFCL only")
    items += list(bfcl_items(Path(args.bfcl_cache)))
    doc = {"benchmark": "bench_schema_coverage", "suite": str(folder) if folder else None}
    doc["coverage"] = cover(items, instances=args.instances)
    print(table(doc, args.show))
    print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
