"""Soak benchmark: one long tiny run, watched for memory and round-time growth.

A real ``fedrcl-flwr run`` (Flower's simulation: SuperLink, simulation process, Ray) of
``--rounds`` rounds (default 1,000), 5 of 100 clients per round, evaluated every
``--eval-every`` rounds (default 50), on a tiny synthetic dataset. At every record of
``metrics.jsonl`` (one per evaluated round) it samples the resident memory (RSS) of every
process of *this* run (the CLI and every process whose environment, command line or
working directory names the run's private home, read from the run's lock file); per
window of ``--window`` rounds (default 100) it prints the total RSS at the window's end
and the mean round time of the window (from the records' ``wall_time_s``). At the end:
each process's RSS first → last, the total's growth, the round time's growth (first
window → last window) and a verdict:

* ``OK``: total RSS grew by at most ``--max-rss-growth`` (default 10 %) and the mean round
  time of the last window is at most ``--max-time-growth`` (default 50 %) above the first;
* ``GROWTH``: otherwise (exit 1).

Timings on a loaded machine drift with the load: read the growth with the machine's load
in mind (the script prints the load average at start and end).

    python benchmarks/bench_soak.py                   # 1,000 rounds
    python benchmarks/bench_soak.py --rounds 200      # shorter
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrcl_flwr.launch.processes import procs_with  # noqa: E402

EXPERIMENT = ROOT / "experiments" / "quickstart.yaml"


def rss_bytes(pid: int) -> int:
    """VmRSS of one process (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_name(pid: int) -> str:
    """A short name: the command line's program and first module / script argument."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    name = Path(words[0]).name
    for w in words[1:3]:
        if not w.startswith("-"):
            name += " " + Path(w).name[:40]
            break
        if w == "-m" and len(words) > 2:
            name += " -m " + words[2][:40]
            break
    return name


def run_home(out: Path) -> str | None:
    """The run's private home, from its lock file (second line), once written."""
    from fedrcl_flwr.run.run_files import LOCK_FILE

    try:
        lines = (out / LOCK_FILE).read_text().splitlines()
    except OSError:
        return None
    return lines[1] if len(lines) >= 2 and lines[1].strip() else None


def sample(cli_pid: int, home: str | None) -> dict[int, tuple[str, int]]:
    """{pid: (name, RSS bytes)} of the CLI and every process of the run."""
    pids = {cli_pid, *(procs_with(home) if home else [])}
    out = {}
    for pid in sorted(pids):
        rss = rss_bytes(pid)
        if rss:
            out[pid] = (process_name(pid), rss)
    return out


def read_records(out: Path) -> list[dict]:
    from fedrcl_flwr.run.results import read_metrics

    return read_metrics(out)


def windows(records: list[dict], window: int) -> list[tuple[int, int, float]]:
    """Per window of ``window`` rounds: (first round, last round, mean round time in s),
    from the ``wall_time_s`` of the records at the window's edges (rounds that are
    multiples of ``window``, and the last record). The first window starts at the first
    record (its rounds before have no start time: start-up is not a round)."""
    rows: list[tuple[int, int, float]] = []
    if not records:
        return rows
    start_round, start_t = int(records[0]["round"]), float(records[0]["wall_time_s"])
    for i, r in enumerate(records[1:], 1):
        rnd, t = int(r["round"]), float(r["wall_time_s"])
        if rnd % window == 0 or i == len(records) - 1:
            rows.append((start_round + 1, rnd, (t - start_t) / (rnd - start_round)))
            start_round, start_t = rnd, t
    return rows


def mib(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def growth(first: float, last: float) -> float:
    return (last - first) / first if first else 0.0


def report(
    samples: list[tuple[int, dict]], records: list[dict], window: int, args
) -> tuple[str, bool]:
    """The benchmark's text and whether the verdict is OK."""
    lines = []
    totals = [(rnd, sum(r for _, r in s.values())) for rnd, s in samples]
    time_rows = windows(records, window)
    lines.append(f"{'window':>13} | {'round time':>10} | {'total RSS':>10}")
    by_round = dict(totals)
    for a, b, t in time_rows:
        tot = by_round.get(b)
        lines.append(f"{a:>5}-{b:<7} | {t:9.3f}s | {mib(tot) if tot else '-':>10}")
    first_s, last_s = samples[0][1], samples[-1][1]
    lines.append("processes (RSS at the first sample -> at the last):")
    for pid in sorted(set(first_s) | set(last_s)):
        name = (first_s.get(pid) or last_s.get(pid))[0]
        a = first_s.get(pid, (name, 0))[1]
        b = last_s.get(pid, (name, 0))[1]
        lines.append(f"  {pid:>8} {name:<40} {mib(a):>9} -> {mib(b):>9}")
    rss_g = growth(totals[0][1], totals[-1][1])
    time_g = growth(time_rows[0][2], time_rows[-1][2]) if len(time_rows) > 1 else 0.0
    lines.append(
        f"total RSS {mib(totals[0][1])} (round {totals[0][0]}) -> {mib(totals[-1][1])} "
        f"(round {totals[-1][0]}): {100 * rss_g:+.1f}%"
    )
    if len(time_rows) > 1:
        lines.append(
            f"round time {time_rows[0][2]:.3f}s (first window) -> {time_rows[-1][2]:.3f}s "
            f"(last window): {100 * time_g:+.1f}%"
        )
    ok = rss_g <= args.max_rss_growth and time_g <= args.max_time_growth
    lines.append(
        f"verdict: {'OK' if ok else 'GROWTH'} (limits: RSS {100 * args.max_rss_growth:+.0f}%, "
        f"round time {100 * args.max_time_growth:+.0f}%)"
    )
    return "\n".join(lines), ok


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--num-clients", type=int, default=100)
    p.add_argument("--clients-per-round", type=int, default=5)
    p.add_argument("--max-rss-growth", type=float, default=0.10)
    p.add_argument("--max-time-growth", type=float, default=0.50)
    p.add_argument("--out", type=Path, default=None, help="run directory (default: a temp dir)")
    p.add_argument("--poll", type=float, default=0.5)
    return p.parse_args(argv)


def overrides(args) -> list[str]:
    return [
        "dataset.synthetic={num_train: 2000, num_test: 200, num_classes: 10, "
        "image_size: 16, channels: 3, subclusters: 2}",
        f"federation.num_clients={args.num_clients}",
        "federation.participation=null",
        f"federation.clients_per_round={args.clients_per_round}",
        f"federation.rounds={args.rounds}",
        f"federation.eval_every={args.eval_every}",
        "client.local_epochs=1",
        "client.batch_size=20",
        f"evaluation.target_rounds=[{args.rounds}]",
        "output.checkpoint_every=0",
        "output.save_model=false",
    ]


def main(argv=None) -> int:
    args = parse(argv)
    tmp = None
    if args.out is None:
        tmp = tempfile.mkdtemp(prefix="bench-soak-")
        args.out = Path(tmp) / "run"
    cmd = [sys.executable, "-m", "fedrcl_flwr.cli", "run", str(EXPERIMENT), "--out", str(args.out)]
    for s in overrides(args):
        cmd += ["--set", s]
    print(
        f"bench_soak: {args.rounds} rounds, {args.clients_per_round} of {args.num_clients} "
        f"clients, eval every {args.eval_every}, window {args.window}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    samples: list[tuple[int, dict]] = []
    seen = 0
    try:
        while proc.poll() is None:
            recs = read_records(args.out)
            if len(recs) > seen:
                seen = len(recs)
                samples.append((int(recs[-1]["round"]), sample(proc.pid, run_home(args.out))))
            time.sleep(args.poll)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    out_text = proc.stdout.read() if proc.stdout else ""
    records = read_records(args.out)
    if proc.returncode != 0 or len(samples) < 1 or not records:
        print(f"bench_soak: the run failed (exit {proc.returncode}):\n{out_text[-2000:]}")
        return 2
    text, ok = report(samples, records, args.window, args)
    print(text)
    print(
        f"wall {time.time() - t0:.0f}s; load average {os.getloadavg()[0]:.1f} at the end",
        flush=True,
    )
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
