"""Mask timings written by the processor to a file and read back (step_log.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from callgate.decoding.step_log import ENV_VAR, StepLog, StepRecord, read_step_log
from tests.test_decoding_processor import WIDTH, ByteBatch, Update, lark, params


def test_records_round_trip_in_blocks(tmp_path: Path) -> None:
    path = tmp_path / "steps.log"
    log = StepLog(path, flush_every=3)
    records = [StepRecord(1000 + i, i % 4, 7 * i, 10**12 + i, i % 3, i, 2 * i, 3 * i, 4 * i) for i in range(7)]
    parts = [(r.advance_ns, r.fill_ns, r.check_ns, r.kernel_ns) for r in records]
    for r, p in zip(records[:2], parts[:2], strict=True):
        log.record(r.elapsed_ns, r.rows, r.budget_ns, r.at_ns, passed=r.passed, parts=p)
    assert read_step_log(path) == []  # still buffered
    for r, p in zip(records[2:], parts[2:], strict=True):
        log.record(r.elapsed_ns, r.rows, r.budget_ns, r.at_ns, passed=r.passed, parts=p)
    assert read_step_log(path) == records[:6]
    log.close()
    assert read_step_log(path) == records


def test_a_log_from_before_the_passed_field_or_the_parts_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "steps.log"
    path.write_text("10 2 3 40\n11 2 0 41 1\n12 2\n13 2 0 42 1 1 2 3\n14 2 0 43 1 1 2 3 4\n")
    assert read_step_log(path) == [
        StepRecord(10, 2, 3, 40, -1),
        StepRecord(11, 2, 0, 41, 1),  # parts -1
        StepRecord(14, 2, 0, 43, 1, 1, 2, 3, 4),
    ]
    assert read_step_log(path)[1].fill_ns == -1


def test_a_quiet_log_is_flushed_after_its_time(tmp_path: Path) -> None:
    path = tmp_path / "steps.log"
    log = StepLog(path, flush_every=1000, flush_after_s=0.0)
    before = time.monotonic_ns()
    log.record(5, 1, 0)
    (record,) = read_step_log(path)
    assert (record.elapsed_ns, record.rows, record.budget_ns) == (5, 1, 0)
    assert before <= record.at_ns <= time.monotonic_ns()  # stamped when recorded
    log = StepLog(path, flush_every=1000, flush_after_s=3600.0)
    log.record(6, 1, 0)
    assert len(read_step_log(path)) == 1
    log.close()


def test_two_writers_append_to_one_file(tmp_path: Path) -> None:
    path = tmp_path / "steps.log"
    a, b = StepLog(path, flush_every=1), StepLog(path, flush_every=1)
    a.record(1, 1, 0)
    b.record(2, 2, 0)
    a.record(3, 1, 5)
    assert [r.elapsed_ns for r in read_step_log(path)] == [1, 2, 3]


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "steps.log"
    path.write_text("10 1 0 7\nnot a record\n20 2 3 8\n30 1 0 9")
    assert read_step_log(path) == [StepRecord(10, 1, 0, 7), StepRecord(20, 2, 3, 8)]
    assert read_step_log(tmp_path / "missing.log") == []


def test_the_environment_variable_turns_it_on() -> None:
    assert StepLog.from_environment({}) is None
    assert StepLog.from_environment({ENV_VAR: ""}) is None
    log = StepLog.from_environment({ENV_VAR: "/tmp/x.log"})
    assert log is not None and log.path == Path("/tmp/x.log")
    log.close()
    with pytest.raises(ValueError, match="flush_every"):
        StepLog("/tmp/x.log", flush_every=0)


def test_the_processor_logs_each_masked_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mask.log"
    monkeypatch.setenv(ENV_VAR, str(path))
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = []
    batch.update_state(Update(added=[(0, params(lark("/a+b/", "ab")), None, out), (1, params(None), None, [])]))
    for token in b"aab":
        batch.apply(torch.zeros(2, WIDTH))
        out.append(token)
    batch.update_state(Update(removed=[0]))
    batch.apply(torch.zeros(2, WIDTH))  # nothing constrained: no record
    assert batch.step_log is not None
    batch.step_log.close()
    records = read_step_log(path)
    assert [r.rows for r in records] == [1, 1, 1]
    assert all(r.elapsed_ns > 0 and r.budget_ns == 0 for r in records)  # no max_tokens: no closing
    for r in records:  # the parts: each timed, within the step; sampled rows: no argmax check
        parts = (r.advance_ns, r.fill_ns, r.check_ns, r.kernel_ns)
        assert min(parts) >= 0 and r.fill_ns > 0 and r.kernel_ns > 0
        assert r.budget_ns + sum(parts) <= r.elapsed_ns


def test_time_in_budget_closing_is_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mask.log"
    monkeypatch.setenv(ENV_VAR, str(path))
    batch = ByteBatch(None, "cpu", False)
    spec = lark('"{" /a*/ "}"', "braced")
    batch.update_state(Update(added=[(0, params(spec, max_tokens=3), None, [ord("{")])]))
    logits = batch.apply(torch.zeros(1, WIDTH))
    # 2 left: the row follows its closing plan, "}" then EOS
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == {ord("}")}
    assert batch.step_log is not None
    batch.step_log.close()
    (record,) = read_step_log(path)
    assert record.rows == 1 and 0 < record.budget_ns <= record.elapsed_ns


def test_flush_all_writes_what_every_open_log_buffers(tmp_path: Path) -> None:
    from callgate.decoding.step_log import StepLog, flush_all, read_step_log

    logs = [StepLog(tmp_path / f"{i}.log", flush_every=1000, flush_after_s=3600) for i in range(2)]
    for i, log in enumerate(logs):
        log.record(1000 + i, 1, 0, at_ns=5)
    assert all(read_step_log(log.path) == [] for log in logs)
    flush_all()
    assert [[r.elapsed_ns for r in read_step_log(log.path)] for log in logs] == [[1000], [1001]]
