"""The thread count of a kernel call (``tensor_compiler.threads.threads_for``): one thread
for small work, and one thread until the load estimate has measured a whole window (its
first reading reports an idle machine; a parallel region on a busy one stalls for a
scheduler time slice), then the free cores."""
import torch

from scorch.tensor_compiler import threads


def _fresh(monkeypatch, clock, free):
    """threads_for as in a new process, with a fake clock and load estimate."""
    readings = []

    def free_cores(T):
        readings.append(T)
        return free
    monkeypatch.setattr(threads, "_free_cores", None)
    monkeypatch.setattr(threads, "_load_known", False)
    monkeypatch.setattr(threads, "_load_known_at", None)
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    import scorch._runtime.convert as convert
    monkeypatch.setattr(convert, "free_cores", free_cores)
    return readings


def test_one_thread_until_the_load_is_measured(monkeypatch):
    clock = [100.0]
    readings = _fresh(monkeypatch, clock, free=2)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        big = 10 * threads.PARALLEL_MIN_WORK
        assert threads.threads_for(big) == 1          # opens the window
        assert readings == [2]
        clock[0] += threads.LOAD_WINDOW_S / 2
        assert threads.threads_for(big) == 1          # the window is not over yet
        clock[0] += threads.LOAD_WINDOW_S
        assert threads.threads_for(big) == 2          # now the estimate decides
        assert threads.threads_for(threads.PARALLEL_MIN_WORK - 1) == 1   # small work
    finally:
        torch.set_num_threads(old)


def test_busy_machine_gets_its_free_cores(monkeypatch):
    clock = [5.0]
    _fresh(monkeypatch, clock, free=1)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        threads.threads_for(10 ** 6)
        clock[0] += 1.0
        assert threads.threads_for(10 ** 6) == 1
    finally:
        torch.set_num_threads(old)


def test_one_thread_asked_is_one_thread(monkeypatch):
    readings = _fresh(monkeypatch, [0.0], free=4)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert threads.threads_for(10 ** 7) == 1
        assert readings == []                          # no load reading needed
    finally:
        torch.set_num_threads(old)


def test_work_per_thread_caps_the_threads(monkeypatch):
    """``SCORCH_WORK_PER_THREAD``: each thread gets at least that much work."""
    clock = [0.0]
    readings = _fresh(monkeypatch, clock, free=2)
    monkeypatch.setattr(threads, "_load_known", True)
    monkeypatch.setattr(threads, "WORK_PER_THREAD", 40_000)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert threads.threads_for(60_000) == 1        # one thread's worth
        assert readings == []
        assert threads.threads_for(80_000) == 2
        assert readings[-1] == 2
    finally:
        torch.set_num_threads(old)


def test_passive_workers_need_more_work_to_wake(monkeypatch):
    """Under OMP_WAIT_POLICY=PASSIVE a parallel region wakes sleeping workers (tens of us),
    so work between PARALLEL_MIN_WORK and PASSIVE_MIN_WORK stays on one thread there, and
    goes parallel with spinning workers."""
    clock = [50.0]
    _fresh(monkeypatch, clock, free=2)
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 2)
    threads.threads_for(10 ** 7)
    clock[0] += 1.0
    middle = (threads.PARALLEL_MIN_WORK + threads.PASSIVE_MIN_WORK) // 2
    assert threads.PARALLEL_MIN_WORK < middle < threads.PASSIVE_MIN_WORK
    monkeypatch.setattr(threads, "PASSIVE", False)
    assert threads.threads_for(middle) == 2
    monkeypatch.setattr(threads, "PASSIVE", True)
    assert threads.threads_for(middle) == 1
    assert threads.threads_for(threads.PASSIVE_MIN_WORK) == 2
