"""``benchmarks/bench_gpu_rounds.py --tiny`` stays alive: its three modes (the sequential
runner, Flower with one actor, Flower with two) run on the CPU and it prints the table.
The GPU figures themselves are recorded in docs/performance.md."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import leftover_procs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.flwr
def test_bench_gpu_rounds_tiny_runs_the_bare_loop_and_flower():
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gpu_rounds.py"), "--tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = [ln for ln in res.stdout.splitlines() if re.search(r"\d+\.\d\dx$", ln)]
    assert [r.split("  ")[0] for r in rows] == [
        "bare sequential loop (in-process)",
        "flower, 2 actors (1 CPU each)",
    ]
    per_hour = [float(r.split()[-3]) for r in rows]
    assert all(v > 0 for v in per_hour) and rows[0].endswith("1.00x")
    assert re.search(r"^ratio .*: \d+\.\d\dx rounds per hour$", res.stdout, re.M)
    left = leftover_procs()
    assert not left, f"left processes behind: {left}"


def test_bench_gpu_rounds_without_a_gpu_says_so(monkeypatch, capsys):
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_gpu_rounds

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu_rounds.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible" in err and "--tiny" in err
