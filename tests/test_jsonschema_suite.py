"""The built-in JsonSchemaValidator against the official JSON-Schema-Test-Suite, Draft 2020-12.

Every required case (tests/draft2020-12/*.json; the optional/ folder is not required)
must get the suite's expected verdict through `JsonSchemaValidator.validate`. The suite's
remote documents (served by the suite at http://localhost:1234/) come from its remotes/
folder through a referencing Registry: nothing is fetched. The suite is unpacked by
scripts/install.sh into .cache/json-schema-test-suite; without it this module skips.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import referencing
from referencing.jsonschema import DRAFT202012

from callgate.serving.handoff.validation import JsonSchemaValidator, ValidationRequest

SUITE = Path(__file__).resolve().parent.parent / ".cache" / "json-schema-test-suite"
CASES = SUITE / "tests" / "draft2020-12"
REMOTES = SUITE / "remotes"
REMOTE_BASE = "http://localhost:1234/"

# Required cases whose expected verdict the built-in validator does not give, with why.
EXEMPT: dict[str, str] = {
    "vocabulary: schema that uses custom metaschema with with no validation vocabulary: no validation: "
    "invalid number, but it still validates": (
        "custom metaschemas that drop the validation vocabulary ($vocabulary) are not honoured: "
        "tool parameters are always checked with the full Draft 2020-12 vocabularies "
        "(the python-jsonschema library does not implement $vocabulary)"
    ),
}


def suite_cases() -> Iterator[Any]:
    if not CASES.is_dir():
        return
    for path in sorted(CASES.glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            for test in group["tests"]:
                case_id = f"{path.stem}: {group['description']}: {test['description']}"
                marks = [pytest.mark.skip(reason=EXEMPT[case_id])] if case_id in EXEMPT else []
                yield pytest.param(group["schema"], test["data"], test["valid"], id=case_id, marks=marks)


def remote_registry() -> referencing.Registry[Any]:
    resources = []
    for path in sorted(REMOTES.rglob("*.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        uri = REMOTE_BASE + path.relative_to(REMOTES).as_posix()
        resources.append((uri, referencing.Resource.from_contents(contents, default_specification=DRAFT202012)))
    registry: referencing.Registry[Any] = referencing.Registry().with_resources(resources)
    return registry


@pytest.fixture(scope="module")
def validator() -> JsonSchemaValidator:
    return JsonSchemaValidator(remote_registry())


def envelope(schema: Any, data: Any) -> ValidationRequest:
    return ValidationRequest(
        request_id="chatcmpl-suite",
        call_id="call_suite",
        tool="suite",
        arguments=data,
        raw="",
        format="hermes",
        model="suite",
        schema=schema,
        constrained=False,
        actor="anonymous",
        scope="0" * 64,
        idempotency_key="0" * 64,
    )


def test_the_suite_is_present() -> None:
    if not CASES.is_dir():
        pytest.skip(f"JSON-Schema-Test-Suite not unpacked at {SUITE}; run scripts/install.sh")
    assert len(list(CASES.glob("*.json"))) >= 40 and REMOTES.is_dir()


@pytest.mark.parametrize(("schema", "data", "valid"), list(suite_cases()))
async def test_required_case(validator: JsonSchemaValidator, schema: Any, data: Any, valid: bool) -> None:
    verdict = await validator.validate(envelope(schema, data))
    assert verdict.verdict == ("accepted" if valid else "rejected"), verdict.errors
    if not valid:
        assert verdict.retryable and all(e["path"] == "" or e["path"].startswith("/") for e in verdict.errors)


def test_the_run_is_large_enough() -> None:
    if not CASES.is_dir():
        pytest.skip(f"JSON-Schema-Test-Suite not unpacked at {SUITE}; run scripts/install.sh")
    assert sum(1 for _ in suite_cases()) > 1000
