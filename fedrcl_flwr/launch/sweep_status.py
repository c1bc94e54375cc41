"""What a sweep reports while it runs: its time left (:class:`SweepEta`, shown on each
progress line), ``sweep_status.json`` (:func:`_read_status`), a finished run's reported
metric (:func:`_reported`) and a failed run's last error line (:func:`_log_tail`).
:mod:`fedrcl_flwr.launch.sweep` prints and records them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedrcl_flwr.run.run_files import SUMMARY_FILE
from fedrcl_flwr.run.summaries import reported_value


class SweepEta:
    """The time a sweep has left, from what this sweep measured itself (an
    estimate from the whole elapsed time over the rounds done counted every run's
    start-up against one round, 4 h 17 min for a 16-minute sweep).

    Measured: ``r``, the seconds per round (each record's ``round_time_s``, the mean of
    the latest ``window``, leaving out a run's first round after a (re)start, which
    includes Ray's actor start: 32 s against 0.8 s seen); each run's time from launch to
    its first recorded round; and, once runs have finished, each one's whole time and
    rounds. A run costs its *overhead* (whole time − rounds · r: Flower's and Ray's start,
    writing the results, tearing down) plus its rounds; the part before its first round
    is (launch → first round) − r, the rest is its end. With ``jobs`` runs at a time,
    each progressing one round per ``r``: ``ETA = max(work / jobs, longest run in
    flight)``, work = per run in flight its rounds left and its end, per queued run its
    overhead and rounds. None until a round other than a first one is recorded."""

    def __init__(self, jobs: int, window: int = 50):
        self.jobs = max(int(jobs), 1)
        self.window = window
        self.rounds: list[float] = []
        self.to_first: list[float] = []  # launch -> first round recorded
        self.finished: list[tuple] = []  # (whole seconds, rounds run)

    def observe_round(self, seconds: Any, first_of_launch: bool = False) -> None:
        if not first_of_launch and isinstance(seconds, (int, float)) and seconds >= 0:
            self.rounds.append(float(seconds))

    def observe_startup(self, seconds: float) -> None:
        """A run's first round was recorded ``seconds`` after its launch."""
        self.to_first.append(max(float(seconds), 0.0))

    def observe_finish(self, seconds: float, rounds: int) -> None:
        """A run ended ``seconds`` after its launch, having run ``rounds`` rounds."""
        self.finished.append((float(seconds), int(rounds)))

    def round_s(self) -> float | None:
        recent = self.rounds[-self.window :]
        return sum(recent) / len(recent) if recent else None

    def eta(self, in_flight: list[int], queued: list[int]) -> float | None:
        """``in_flight``: rounds left of each running run; ``queued``: rounds of each
        run not started yet."""
        if not in_flight and not queued:
            return 0.0
        r = self.round_s()
        if r is None:
            return None

        def mean(xs: list) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        start = max(mean(self.to_first) - r, 0.0)
        if self.finished:
            whole = mean([max(t - n * r, 0.0) for t, n in self.finished])
            end = max(whole - start, 0.0)
        else:
            whole, end = start, 0.0
        work = sum(n * r + end for n in in_flight) + sum(whole + n * r for n in queued)
        return max(work / self.jobs, max(in_flight, default=0) * r + end)


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _read_status(path: Path) -> dict:
    """``sweep_status.json`` as a mapping (empty when absent or unreadable: it is rebuilt
    from the runs)."""
    try:
        status = json.loads(path.read_text()) if path.is_file() else {}
    except (ValueError, OSError, RecursionError):
        return {}
    return status if isinstance(status, dict) else {}


def _is_number(v: Any) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _reported(run_dir: Path) -> tuple[str, float | None]:
    """The metric a finished run reports (its summary's ``report_metric``: the study's,
    a domain mean for an inter-domain run) and its value (``None`` if absent or
    unreadable: only shown on the progress line)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_bytes()[: 1 << 20])
    except (ValueError, OSError, RecursionError):
        return "final", None
    if not isinstance(summary, dict):
        return "final", None
    metric = summary.get("report_metric")
    metric = metric if isinstance(metric, str) and metric else "final"
    value = reported_value(summary, metric)
    return metric, float(value) if value is not None and _is_number(value) else None


def _log_tail(path: Path) -> str:
    try:
        rows = [r.strip() for r in path.read_text().splitlines() if r.strip()]
    except OSError:
        return ""
    errs = [r for r in rows if r.startswith("fedrcl-flwr:") and ("error" in r or "failed" in r)]
    return (errs[-1] if errs else (rows[-1] if rows else ""))[:300]
