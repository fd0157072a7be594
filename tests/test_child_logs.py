"""Issue 26: what the sampling child says reaches the backend's ``sampler`` logger, once,
and never stalls the child."""

from __future__ import annotations

import logging
import os

import fake_driver
import pytest
from conftest import FAST, RUN, Recorder, wait_for

import sampler
from sampler.ipc.logpipe import FRAME_BYTES, LogReader, PipeHandler

MISMATCH = "NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)"


def said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sampler" and words in r.getMessage()]


def test_a_child_warning_reaches_the_sampler_logger_once_and_not_stderr(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    nvml.configure(devices=[{}], init_error=18)
    with sampler.ResourceMonitor(sink=Recorder(), categories=["cpu", "gpu"], step_source="seconds", **FAST):
        wait_for(lambda: said(caplog, MISMATCH), what="the child's warning in the backend's logger")
    assert len(said(caplog, MISMATCH)) == 1
    (record,) = [r for r in caplog.records if MISMATCH in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert MISMATCH not in capfd.readouterr().err


def test_a_full_pipe_never_blocks_the_child_and_what_it_dropped_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    child = logging.getLogger(f"child-{RUN}")
    child.propagate = False
    handler = PipeHandler(write_fd)
    child.addHandler(handler)
    try:
        line = "x" * (FRAME_BYTES - 100)
        sent = 0
        while not handler.dropped:  # a pipe holds a bounded amount: this ends without blocking
            child.warning("%d %s", sent, line)
            sent += 1
        child.warning("one more, dropped too")
        assert handler.dropped == 2
        reader = LogReader(read_fd)
        assert reader.read()
        got = [r.getMessage() for r in caplog.records if r.name == "sampler"]
        assert [text.split()[0] for text in got] == [str(n) for n in range(sent - 1)]
        child.error("after the drop")
        assert reader.read()
        *_, note, last = [r for r in caplog.records if r.name == "sampler"]
        assert "2 log lines of the sampling child" in note.getMessage() and note.levelno == logging.WARNING
        assert last.getMessage() == "after the drop" and last.levelno == logging.ERROR
        assert handler.dropped == 0
    finally:
        child.removeHandler(handler)
        os.close(write_fd)
        assert not LogReader(read_fd).read()  # at its end
        os.close(read_fd)


def test_a_line_with_a_nul_arrives_whole_and_a_pipe_whose_reader_is_gone_takes_what_is_said(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    child = logging.getLogger(f"child-{RUN}")
    child.propagate = False
    handler = PipeHandler(write_fd)
    child.addHandler(handler)
    try:
        child.warning("a\0b")
        assert LogReader(read_fd).read()
        (got,) = [r.getMessage() for r in caplog.records if r.name == "sampler"]
        assert got == "a\\0b"
        os.close(read_fd)  # the backend is gone
        child.warning("to nobody")  # EPIPE: nothing raised, nothing counted as dropped
        assert handler.dropped == 0 and "Logging error" not in capfd.readouterr().err
    finally:
        child.removeHandler(handler)
        os.close(write_fd)
