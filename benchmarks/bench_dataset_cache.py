"""First-round time and peak memory (PSS summed over every process of the run: CLI,
SuperLink, simulation process, Ray workers; shared pages counted once) of a 2-round
``fedrcl-flwr run``, for the quickstart and for a CIFAR-sized synthetic dataset
(50,000 x 32x32x3 training images).

    python benchmarks/bench_dataset_cache.py                 # this checkout
    python benchmarks/bench_dataset_cache.py --code DIR      # another checkout (e.g. the
                                                             # commit before the cache)

The dataset cache is warmed once before the measured runs (``fedrcl-flwr partition``, which
builds the entry), as every run after the first of a sweep finds it; checkouts without a
cache just build the data in every process, which is what they measure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, memory_of_run_processes

SETTINGS = {
    "quickstart": [],
    "cifar-sized": ["dataset.synthetic.num_train=50000", "dataset.synthetic.num_test=10000"],
}


def run(code: Path, sets: list[str], env: dict) -> dict:
    exp = str(code / "experiments" / "quickstart.yaml")
    with tempfile.TemporaryDirectory() as out:
        args = [sys.executable, "-m", "fedrcl_flwr.cli", "run", exp, "--out", out]
        for s in sets:
            args += ["--set", s]
        t0 = time.time()
        proc = subprocess.Popen(
            args, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, memory_of_run_processes(proc.pid))
            time.sleep(0.3)
        text = proc.stdout.read()
        wall = time.time() - t0
        if proc.returncode != 0:
            print(text[-3000:], file=sys.stderr)
            return {"rc": proc.returncode}
        recs = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return {"rc": 0, "wall": wall, "peak": peak, "round1": recs[0]["round_time_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", default=str(ROOT), help="checkout to measure (default: this)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    code = Path(args.code).resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    print(f"code: {code}")
    for name, extra in SETTINGS.items():
        sets = [f"federation.rounds={args.rounds}", "output.checkpoint_every=0", *extra]
        warm = [
            sys.executable,
            "-m",
            "fedrcl_flwr.cli",
            "partition",
            str(code / "experiments" / "quickstart.yaml"),
            "--max-rows",
            "0",
        ]
        for s in sets:
            warm += ["--set", s]
        subprocess.run(warm, cwd=code, env=env, capture_output=True)
        r = run(code, sets, env)
        if r["rc"]:
            print(f"{name}: run failed (exit {r['rc']})")
            return 1
        print(
            f"{name}: first round {r['round1']:.1f}s, peak PSS of all run processes "
            f"{r['peak'] / 2**20:.0f} MiB, whole run {r['wall']:.1f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
