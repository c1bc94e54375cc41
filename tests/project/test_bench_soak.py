"""``benchmarks/bench_soak.py``: its report of a soak run, checked on six rounds
with windows of two: one row per window with the round time and total RSS, every process
first -> last, the growth of both and the verdict (in process: the round records are
those a run writes, the RSS that of this test's own process)."""

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_soak  # noqa: E402


def _report(times, rss_growth=0):
    records, t = [], 10.0
    for rnd, dt in enumerate(times, 1):
        t += dt
        if rnd % 2 == 0:  # evaluated every 2 rounds
            records.append({"round": rnd, "wall_time_s": t, "test_accuracy": 0.5})
    base = bench_soak.sample(os.getpid(), None)
    assert list(base) == [os.getpid()] and base[os.getpid()][1] > 0
    samples = []
    for i, r in enumerate(records):
        s = {p: (name, rss + i * rss_growth) for p, (name, rss) in base.items()}
        samples.append((r["round"], s))
    args = SimpleNamespace(max_rss_growth=0.10, max_time_growth=0.50)
    return bench_soak.report(samples, records, 2, args)


def test_soak_report_format_and_verdict():
    text, ok = _report([0.5] * 6)
    lines = text.splitlines()
    assert ok and lines[-1].startswith("verdict: OK")
    rows = [ln for ln in lines if re.match(r"\s+\d+-\d+\s+\|", ln)]
    assert [r.split("|")[0].split() for r in rows] == [["3-4"], ["5-6"]]
    assert all(re.search(r"\|\s+0\.500s \|\s+\d+ MiB$", r) for r in rows), rows
    assert re.search(r"^total RSS \d+ MiB \(round 2\) -> \d+ MiB \(round 6\): \+0\.0%$", text, re.M)
    assert re.search(r"^round time 0\.500s \(first window\) -> 0\.500s .*: \+0\.0%$", text, re.M)
    assert any(str(os.getpid()) in ln and "->" in ln for ln in lines)


def test_soak_report_flags_growth():
    text, ok = _report([0.5, 0.5, 0.5, 0.5, 1.0, 1.0])
    assert not ok and "round time 0.500s (first window) -> 1.000s" in text
    assert text.splitlines()[-1].startswith("verdict: GROWTH")
    _, ok = _report([0.5] * 6, rss_growth=1 << 30)  # +1 GiB per sample
    assert not ok
