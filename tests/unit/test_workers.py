"""A soft-NIC worker that ends before its result is named with how it ended and its last words."""
from __future__ import annotations

import subprocess
import sys

import pytest

from emulator.workload.transfer import Worker, WorkerFailed


def worker(code: str) -> Worker:
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return Worker("east-host0", "sender", proc)


def test_an_exit_is_named_with_its_status_and_last_stderr_line():
    w = worker("import sys; sys.stderr.write('Traceback ...\\nMemoryError: out of memory\\n'); sys.exit(3)")
    with pytest.raises(WorkerFailed) as info:
        w.read("ready", "before it was ready")
    assert str(info.value) == ("the soft-NIC on east-host0 (sender) exited with status 3 before it was ready; "
                               "its last words: MemoryError: out of memory")


def test_a_kill_is_named_with_its_signal():
    w = worker("import sys, time; print('{\"ready\": {}}', flush=True); time.sleep(60)")
    assert w.read("ready", "before it was ready") == {}
    w.proc.kill()
    with pytest.raises(WorkerFailed, match=r"east-host0 \(sender\) was killed by SIGKILL during the transfer$"):
        w.read("result", "during the transfer")


def test_an_answer_that_is_not_the_record_is_named():
    w = worker("print('hello', flush=True)")
    with pytest.raises(WorkerFailed, match="answered 'hello' before it was ready, not its ready"):
        w.read("ready", "before it was ready")
    w.proc.wait()
