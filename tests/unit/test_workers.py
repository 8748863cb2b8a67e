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


def test_the_port_sampler_reads_once_before_the_data_and_keeps_to_a_fifth_of_the_time():
    import threading

    from emulator.workload.transfer import PortSampler

    calls: list[float] = []
    fourth = threading.Event()

    def slow() -> dict:  # each reading costs 20 ms: the sampler then waits 80 ms, not 10
        import time

        calls.append(time.monotonic())
        time.sleep(0.02)
        if len(calls) == 4:
            fourth.set()
        return {"n": len(calls)}

    s = PortSampler(slow, 0.01)
    s.start()
    assert s.readings == [{"n": 1}]  # taken in start(), before the caller goes on
    assert fourth.wait(10)
    got = s.stop()
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(got) >= 4 and all(g >= 0.02 + 0.08 * 0.99 for g in gaps), gaps

    # One reading held up (behind the controller's convergence) does not stretch the gap after
    # it fourfold: the pace is the median of the last readings' costs.
    calls.clear()
    sixth = threading.Event()

    def held_once() -> dict:
        import time

        calls.append(time.monotonic())
        time.sleep(0.3 if len(calls) == 3 else 0.02)
        if len(calls) == 6:
            sixth.set()
        return {"n": len(calls)}

    h = PortSampler(held_once, 0.01)
    h.start()
    assert sixth.wait(10)
    h.stop()
    after = calls[3] - calls[2] - 0.3
    assert after < 0.3, after  # 4 x 0.3 s were it paced by the last reading alone

    def broken() -> dict:
        raise OSError("controller gone")

    b = PortSampler(broken, 0.01)
    b.start()
    assert b.error == "OSError: controller gone" and b.stop() == [] and b.ident is None


@pytest.mark.parametrize("dilation", [1.0, 10.0, 200.0, 1000.0])
def test_a_qp_never_times_out_before_a_cross_dc_ack_can_be_back(dilation):
    """At any dilation the longest timeout (virtual) outlasts the path's RTT (wall / dilation) a few
    times over, and the first one waits longer than the RTT too: else a 30 ms path resends what is
    only in flight."""
    from emulator.workload.worker import qp_config
    rtt_wall = 30e-3 * dilation  # the cross-DC RTT, 30 ms of the real fabric's time
    cfg = qp_config("selective", 2e6, rtt_wall, qps=16, dilation=dilation)
    rtt = rtt_wall / dilation
    assert cfg.rto_max >= 4 * rtt
    assert cfg.rto_initial > rtt
    assert cfg.rto_min <= cfg.rto_initial <= cfg.rto_max
