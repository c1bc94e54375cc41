"""Simulation overhead: whole-process wall time of ``fedrcl-flwr run`` (Flower's runtime:
SuperLink, ``flwr run``, Ray, one actor per core) against the same experiment driven by
the project's sequential in-process runner (:func:`fedrcl_flwr.app.inprocess.run_inprocess`:
the same strategy and clients, no Flower runtime, no Ray) in a fresh Python process with
torch's default number of threads — the fair "bare loop" a user would write.

Goals (issue #16, this 2-core machine): <= 1.10x for a 20-round quickstart and <= 1.5x
for a 5-round one. Both are measured in one invocation:

    python benchmarks/bench_simulation_overhead.py [--rounds 20 5] [--repeat 1]

Every number is a whole process measured from the outside (``time`` of ``Popen`` to exit).
Each round line a runner prints is time-stamped as it arrives, which splits a run into
start-up (process start to the start of round 1: the first line's arrival minus round 1's
own time), rounds (steady state: the mean interval between round lines) and the
end (last round line to process exit). The dataset cache (``dataset.cache_dir``) is warmed first, so neither side builds the
dataset; its one-off build time is printed separately. One line per setting ends in
``ratio X.XXx`` (goal met / missed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT

GOALS = {20: 1.10, 5: 1.5}

INPROCESS = """
import sys
from pathlib import Path
from fedrcl_flwr.cli import _load
from fedrcl_flwr.app.inprocess import run_inprocess
cfg = _load(sys.argv[1], sys.argv[3:], sys.argv[2])
run_inprocess(cfg, Path(cfg.output_dir()))
"""


def timed_process(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``; return wall seconds, the arrival time of each round line (seconds after
    start) with the round's own ``round_time_s`` printed at its end, and the exit code."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    rounds, tail = [], []
    for line in proc.stdout:
        now = time.perf_counter() - t0
        tail = (tail + [line])[-40:]
        text = line.strip()
        if text.startswith("round ") and text.endswith("s") and "|" in text:
            secs = float(text.rsplit("|", 1)[1].strip().rstrip("s"))
            rounds.append((now, secs))
    proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print("".join(tail), file=sys.stderr)
    out = {"rc": proc.returncode, "wall": wall, "rounds": rounds}
    if rounds:
        out["startup"] = rounds[0][0] - rounds[0][1]
        out["end"] = wall - rounds[-1][0]
        out["round1"] = rounds[0][1]
        # a round as seen from outside: the mean interval between round lines 1..N (the
        # ServerApp evaluates round r while r+1 trains, so round_time_s overlaps; the CLI
        # prints a line within 0.25 s of its record, so single intervals are quantised)
        out["steady"] = ((rounds[-1][0] - rounds[0][0]) / (len(rounds) - 1)
                         if len(rounds) > 1 else float("nan"))
    return out


def measure(rounds: int, exp: Path, base_sets: list[str], env: dict) -> tuple[dict, dict]:
    sets = [f"federation.rounds={rounds}", *base_sets]
    with tempfile.TemporaryDirectory() as out_a, tempfile.TemporaryDirectory() as out_b:
        inproc = timed_process([sys.executable, "-c", INPROCESS, str(exp), out_a, *sets], env)
        cli = [sys.executable, "-m", "fedrcl_flwr.cli", "run", str(exp), "--out", out_b]
        for s in sets:
            cli += ["--set", s]
        flower = timed_process(cli, env)
    return inproc, flower


def describe(name: str, r: dict) -> str:
    if r["rc"] != 0 or not r["rounds"]:
        return f"  {name:<22} FAILED (exit {r['rc']})"
    return (f"  {name:<22} {r['wall']:6.1f}s = start-up {r['startup']:5.1f}s + rounds "
            f"{r['rounds'][-1][0] - r['startup']:5.1f}s (round 1 {r['round1']:.1f}s, later "
            f"median {r['steady']:.2f}s) + end {r['end']:4.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[20, 5])
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each setting this many times; the median wall is used")
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "quickstart.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    exp = Path(args.experiment).resolve()
    base_sets = ["output.checkpoint_every=0", *args.set]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")

    # the dataset cache: built once here (what the first run of a sweep pays), then warm
    t0 = time.perf_counter()
    warm = subprocess.run([sys.executable, "-m", "fedrcl_flwr.cli", "partition", str(exp),
                           "--max-rows", "0", *sum((["--set", s] for s in base_sets), [])],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if warm.returncode != 0:
        print(warm.stdout[-2000:], warm.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"dataset cache warm-up (CLI process incl. imports): {time.perf_counter() - t0:.1f}s")
    print(f"machine: {os.cpu_count()} cores; in-process runner with torch's default threads")
    worst = 0.0
    failed = False
    for rounds in args.rounds:
        pairs = [measure(rounds, exp, base_sets, env) for _ in range(args.repeat)]
        if any(a["rc"] or b["rc"] for a, b in pairs):
            failed = True
        inproc = sorted((p[0] for p in pairs), key=lambda r: r["wall"])[len(pairs) // 2]
        flower = sorted((p[1] for p in pairs), key=lambda r: r["wall"])[len(pairs) // 2]
        print(f"{rounds} rounds:")
        print(describe("in-process runner", inproc))
        print(describe("fedrcl-flwr run", flower))
        if inproc["rc"] or flower["rc"]:
            continue
        ratio = flower["wall"] / inproc["wall"]
        goal = GOALS.get(rounds)
        verdict = "" if goal is None else (f" (goal <= {goal:.2f}x: "
                                           f"{'met' if ratio <= goal else 'missed'})")
        print(f"  start-up: flower {flower['startup']:.1f}s vs in-process "
              f"{inproc['startup']:.1f}s; steady round: flower {flower['steady']:.2f}s vs "
              f"in-process {inproc['steady']:.2f}s = {flower['steady'] / inproc['steady']:.2f}x")
        print(f"{rounds} rounds: ratio {ratio:.2f}x{verdict}")
        worst = max(worst, ratio)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
