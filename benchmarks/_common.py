"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedrcl_flwr.launch.processes import procs_with


def _pss_bytes(proc_dir: Path) -> int:
    """Proportional set size of one process: private pages plus its share of pages it
    shares with others (torch's libraries mapped by every Ray worker, Ray's object store),
    so that a sum over processes counts shared memory once. Falls back to VmRSS."""
    try:
        for line in (proc_dir / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    for line in (proc_dir / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def memory_of_run_processes(cli_pid: int, marker: str = "fedrcl-flwr-home-") -> int:
    """Total memory (bytes, PSS) of every process started for a CLI run (their environment
    names the run's private FLWR_HOME) plus the CLI process itself."""
    total = 0
    for pid in {cli_pid, *procs_with(marker)}:
        try:
            total += _pss_bytes(Path(f"/proc/{pid}"))
        except OSError:  # ended between the scan and the read
            continue
    return total


def run_cli_measuring(args: list[str], poll_s: float = 0.5) -> tuple[int, float, int]:
    """Run ``fedrcl-flwr`` with ``args``; return (exit code, wall seconds, peak memory in bytes)."""
    peak = [0]
    done = threading.Event()

    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedrcl_flwr.cli", "run", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], memory_of_run_processes(proc.pid))
            time.sleep(poll_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    wall = time.time() - t0
    done.set()
    t.join()
    if proc.returncode != 0:
        print(out[-2000:], err[-3000:], file=sys.stderr)
    return proc.returncode, wall, peak[0]
