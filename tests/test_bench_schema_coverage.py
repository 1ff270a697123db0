"""bench_schema_coverage's pure helpers: reading the suite's groups, compiling a schema on
each engine (or the reason it is refused), judging the suite's instances against what
compiled, and the table.

Does not know: the real suite or BFCL's wheel (benchmarks/bench_schema_coverage.py reads them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

cov = load_benchmark("bench_schema_coverage")

BOUNDED = cov.Item("suite", "minimum.json#0 bounded", {"type": "integer", "minimum": 1}, False, ((1, True), (0, False)))
NOT = cov.Item("suite", "not.json#0 not", {"not": {"type": "integer"}}, False, (("a", True), (1, False)))
TOOL = cov.Item("bfcl", "simple:f", {"type": "object", "properties": {"x": {"type": "string"}}}, True)


def test_the_suite_is_read_group_by_group(tmp_path: Path) -> None:
    folder = tmp_path / "tests" / "draft2020-12"
    (folder / "optional").mkdir(parents=True)
    test = {"description": "t", "data": "a", "valid": True}
    group = {"description": "d", "schema": {"type": "string"}, "tests": [test]}
    (folder / "type.json").write_text(json.dumps([group, group]))
    (folder / "optional" / "bignum.json").write_text(json.dumps([group]))
    assert cov.suite_dir(str(tmp_path)) == folder
    items = list(cov.suite_items(folder))
    assert [(i.source, i.name) for i in items] == [
        ("suite-optional", "optional/bignum.json#0 d"),
        ("suite", "type.json#0 d"),
        ("suite", "type.json#1 d"),
    ]
    assert items[1].tests == (("a", True),)


@pytest.mark.parametrize("engine", cov.ENGINES)
def test_a_compiled_schema_admits_its_valid_instances(engine: str) -> None:
    accepts = cov.COMPILERS[engine](BOUNDED)
    assert accepts(cov.spelled(1)) and accepts(cov.spelled(17))
    accepts_tool = cov.COMPILERS[engine](TOOL)
    assert accepts_tool(cov.spelled({"x": "y"}))


def test_callgate_refuses_by_the_keyword_it_cannot_enforce() -> None:
    with pytest.raises(cov.Refused) as caught:
        cov.callgate_compile(NOT)
    assert caught.value.reason == "keyword not"
    with pytest.raises(cov.Refused) as caught:
        cov.llguidance_compile(NOT)
    assert "not" in caught.value.reason


def test_coverage_counts_compiles_refusals_and_instances() -> None:
    doc = cov.cover([BOUNDED, NOT, TOOL], engines=["callgate"])
    suite = doc["suite"]["callgate"]
    assert doc["suite"]["schemas"] == 2 and doc["bfcl"]["schemas"] == 1
    assert (suite["compiled"], suite["refused"]) == (1, 1)
    assert suite["reasons"] == [{"reason": "keyword not", "count": 1, "example": "not.json#0 not"}]
    assert (suite["valid"], suite["valid_admitted"], suite["invalid"], suite["invalid_refused"]) == (1, 1, 1, 1)
    assert suite["valid_refused_by_file"] == {} and suite["invalid_admitted_by_file"] == {}
    assert doc["bfcl"]["callgate"]["compiled"] == 1
    text = cov.table({"coverage": doc})
    assert "| suite | 2 | callgate | 1 | 1 | 1/1 | 1/1 |" in text and "keyword not (1)" in text


def test_instances_are_spelled_as_the_formats_write_json() -> None:
    assert cov.spelled({"a": [1, "é"]}) == '{"a": [1, "é"]}'
