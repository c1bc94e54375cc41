"""``benchmarks/bench_threads.py``: the yardstick of the cross-device goal
runs end to end (one thread, two threads, two one-thread processes side by side) and
prints its figures and the floor they imply, computed from the printed times."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_threads.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_bench_threads_prints_each_setting_and_the_floor():
    out = _bench("--repeat", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    one = float(re.search(r"one thread alone\s+([0-9.]+) ms", out.stdout)[1])
    two = re.search(
        r"two threads alone\s+([0-9.]+) ms per client  \(speed-up ([0-9.]+)x\)", out.stdout
    )
    side = re.search(
        r"side by side\s+([0-9.]+) ms per client  \(([0-9.]+), ([0-9.]+)\)", out.stdout
    )
    assert two and side, out.stdout
    assert one > 0 and abs(float(two[2]) - one / float(two[1])) < 0.02
    pair = float(side[1])
    assert abs(pair - (float(side[2]) + float(side[3])) / 2) < 0.11
    floor = float(out.stdout.strip().splitlines()[-1].rsplit("= ", 1)[1])
    assert abs(floor - pair / 2 / float(two[1])) < 0.02


def test_bench_threads_refuses_a_bad_repeat():
    out = _bench("--repeat", "0")
    assert out.returncode == 2 and "--repeat must be >= 1" in out.stderr
