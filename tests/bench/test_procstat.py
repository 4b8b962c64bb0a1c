"""CPU time from /proc/<pid>/stat."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.procstat import parse_stat, read_cpu

# A real line's shape (proc(5)): pid (comm) state ppid ... utime(14) stime(15) ...
LINE = (
    "4242 (odd (name) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 "
    "250 75 0 0 20 0 1 0 100 1000000 500 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0"
)


def test_parse_stat_counts_fields_after_the_last_parenthesis():
    t = parse_stat(LINE, ticks_per_s=100)
    assert t.user_s == 2.5
    assert t.system_s == 0.75
    assert t.total_s == pytest.approx(3.25)


def test_parse_stat_rejects_garbage():
    with pytest.raises(ValueError, match="stat"):
        parse_stat("no parenthesis here", 100)
    with pytest.raises(ValueError, match="short"):
        parse_stat("1 (x) S 1 2", 100)


def test_read_cpu_of_a_busy_child_grows():
    code = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", code + "time.sleep(60)"])
    try:
        for _ in range(200):
            if read_cpu(child.pid).total_s >= 0.2:
                break
            time.sleep(0.05)
        assert read_cpu(child.pid).total_s >= 0.2
    finally:
        child.kill()
        child.wait()


def test_read_cpu_of_a_missing_process_raises():
    with pytest.raises(OSError):
        read_cpu(2**22 + 12345)
    assert read_cpu(os.getpid()).total_s > 0
