"""What a run leaves on disk, and reading it back.

Files in a run directory:

* ``config.yaml``   - the resolved experiment (defaults + overrides)
* ``metrics.jsonl`` - one JSON object per evaluated round, and per failed round
  (``round_failed: true`` with its ``failure_reason``, evaluated or not)
* ``summary.json``  - method, strategy, ``rounds_failed``, final/EMA/best accuracy, ``last5`` (mean test
  accuracy of the last five evaluated rounds, FedCCL's reported metric) overall and per
  domain, the domain means (``final_domain_mean``, ``best_domain_mean``,
  ``last5_domain_mean``, ``ema_domain_mean_at``: the papers' "Avg"), EMA accuracy at the
  target rounds the run reached, ``report_metric``, time,
  ``client_failures`` (each client that failed in some round: how often, its first error)
* ``model.pt``      - the final global model's state_dict
* ``accuracy.png``  - test accuracy and EMA accuracy per round

(every name a run or a sweep writes is declared in :mod:`fedrcl_flwr.run.run_files`)

This module writes and reads them (the run directory's marker and overwrite checks,
:class:`RunRecorder`, :func:`read_metrics`); what the summary computes is
:mod:`fedrcl_flwr.run.summaries`, the progress lines :mod:`fedrcl_flwr.run.progress`,
the figure :mod:`fedrcl_flwr.run.plots`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedrcl_flwr.run.plots import plot_accuracy
from fedrcl_flwr.run.run_files import (
    MARKER_FILE,
    METRICS_FILE,
    MODEL_FILE,
    PLOT_FILE,
    PLOT_TMP,
    RUN_FILES,
    RUN_SUBDIRS,
    SUMMARY_FILE,
    TMP_SUFFIX,
    append_file,
    atomic_write_bytes,
    guarded_write,
    new_file,
)
from fedrcl_flwr.run.summaries import (
    LAST_K,
    domain_mean_summary,
    last_k_per_domain,
    research_summary,
)


def write_marker(directory: Path, kind: str) -> None:
    """Mark ``directory`` (which exists) as created by the tool for ``kind``; a no-op when
    it is marked already."""
    path = Path(directory) / MARKER_FILE
    if has_marker(directory, kind):
        return
    tmp = path.with_name(f"{MARKER_FILE}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    with new_file(tmp, "w") as fh:  # unique name: concurrent writers both succeed
        fh.write(f"fedrcl-flwr {kind}\n")
    os.replace(tmp, path)


def has_marker(directory: Path, kind: str) -> bool:
    """``directory`` is a real directory (not a link) holding the tool's marker of
    ``kind`` as a regular file (reads at most a few bytes)."""
    d = Path(directory)
    path = d / MARKER_FILE
    try:
        if d.is_symlink() or not d.is_dir() or path.is_symlink() or not path.is_file():
            return False
        with open(path, "rb") as fh:
            return fh.read(64) == f"fedrcl-flwr {kind}\n".encode()
    except OSError:
        return False


def _entries_of_run(out_dir: Path) -> tuple[list[Path], list[Path]]:
    files = [out_dir / f for f in RUN_FILES]
    files += [out_dir / (f + TMP_SUFFIX) for f in RUN_FILES]
    files.append(out_dir / PLOT_TMP)
    return files, [out_dir / d for d in RUN_SUBDIRS]


def overwrite_problem(out_dir: Path) -> str | None:
    """Why ``run --overwrite`` may not clear ``out_dir`` (``None`` when it may; reads
    only): the directory must carry the run marker (the tool created it), each run file
    present must be a regular file or a link (a link is removed, never its target) and
    each run sub-directory present a real directory carrying its own marker."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return None
    files, dirs = _entries_of_run(out_dir)
    present = [p for p in files + dirs if p.exists() or p.is_symlink()]
    if not present:
        return None
    if not has_marker(out_dir, "run"):
        return (
            f"{out_dir} holds {', '.join(p.name for p in present[:4])} but was not "
            f"created by fedrcl-flwr (no {MARKER_FILE} marker); nothing there is "
            "removed: move those files away yourself or choose another --out"
        )
    for p in files:
        if p.exists() and not p.is_symlink() and not p.is_file():
            return f"{p} is not a regular file; remove it yourself or choose another --out"
    for d in dirs:
        if (d.exists() or d.is_symlink()) and not has_marker(d, d.name):
            return (
                f"{d} was not created by fedrcl-flwr (a link, a file, or no "
                f"{MARKER_FILE} marker); remove it yourself or choose another --out"
            )
    return None


def linked_run_entries(out_dir: Path) -> list[str]:
    """The run's files and sub-directories in ``out_dir`` that are symbolic links: a run
    writing through one would write outside its directory (``--overwrite`` removes the
    links themselves; without it such a directory is refused)."""
    files, dirs = _entries_of_run(Path(out_dir))
    return [p.name for p in files + dirs if p.is_symlink()]


def clear_run_dir(out_dir: Path) -> None:
    """Remove a previous run's files and sub-directories from ``out_dir`` (after
    :func:`overwrite_problem` said it may; anything else in the directory stays)."""
    import shutil

    problem = overwrite_problem(out_dir)
    if problem:  # checked by the caller before; the directory changed meanwhile
        raise OSError(problem)
    files, dirs = _entries_of_run(Path(out_dir))
    for p in files:
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)
    for d in dirs:
        if has_marker(d, d.name):
            shutil.rmtree(d)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a full disk: :class:`RunFileError`, no
    ``.tmp`` left, the earlier ``path`` unchanged)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with guarded_write(path, tmp):
        with new_file(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


class RunRecorder:
    """Appends round records, writes the summary, plot and model at the end."""

    def __init__(
        self,
        out_dir: Path,
        *,
        method: str,
        strategy: str,
        rounds: int,
        target_rounds: Iterable[int] = (),
        start_time: float | None = None,
        elapsed_before: float = 0.0,
        report_metric: str = "final",
        title: str = "",
        ema_factor: float = 0.9,
    ):
        self.out_dir = Path(out_dir)
        self.title = title or f"{method} + {strategy}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.method = method
        self.strategy = strategy
        self.rounds = rounds
        self.target_rounds = sorted(set(int(r) for r in target_rounds))
        self.start = start_time if start_time is not None else time.time()
        self.elapsed_before = elapsed_before
        self.report_metric = report_metric
        self.ema_factor = ema_factor  # evaluation.ema, for ema@ROUND_domain_mean
        self.records: list[dict] = []
        # per partition id (text) that failed in some round: {"failed", "rounds",
        # "first_error"} (strategies/round_records.py: failure_counts), set before finish()
        self.client_failures: dict[str, dict] = {}

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    def wall_time(self) -> float:
        return self.elapsed_before + time.time() - self.start

    def load_existing(self, up_to_round: int) -> None:
        """Resume: keep records up to ``up_to_round`` and truncate the file to them."""
        self.records = [r for r in read_metrics(self.out_dir) if r["round"] <= up_to_round]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in self.records))

    def append(self, record: dict) -> dict:
        record = _clean(record)
        line = json.dumps(record) + "\n"
        path = self.metrics_path
        size = path.stat().st_size if path.exists() else 0
        with guarded_write(path, truncate_to=size):  # a torn record is cut back
            with append_file(path) as fh:
                fh.write(line)
                fh.flush()
        self.records.append(record)
        return record

    def summary(self) -> dict:
        """The run's summary. ``ema_accuracy_at`` holds the EMA accuracy and
        ``test_accuracy_at`` the test accuracy at each target round the run reached (the
        last evaluation at or before it); a target beyond the last recorded round is left
        out, never filled in. ``accuracy_at`` is ``ema_accuracy_at`` under the name that
        summaries had before both were written (kept for their readers). ``last5`` is the mean test accuracy
        over the last ``LAST_K`` = 5 evaluated rounds (all of them if fewer), FedCCL's
        "last five communication rounds"; ``last5_per_domain`` the same per domain when
        rounds carry ``domain_accuracy``, and then also the domain means
        (:func:`domain_mean_summary`)."""
        evaluated = [r for r in self.records if r.get("test_accuracy") is not None]
        last = evaluated[-1] if evaluated else {}
        reached = max((int(r["round"]) for r in self.records), default=0)
        ema_at, test_at = {}, {}
        for t in self.target_rounds:
            if t > reached:
                continue
            upto = [r for r in evaluated if r["round"] <= t]
            if upto:
                ema_at[str(t)] = upto[-1]["ema_accuracy"]
                test_at[str(t)] = upto[-1]["test_accuracy"]
        tail = evaluated[-LAST_K:]
        out = {
            "method": self.method,
            "strategy": self.strategy,
            "rounds": last.get("round", 0),
            "final_accuracy": last.get("test_accuracy"),
            "final_loss": last.get("test_loss"),
            "ema_accuracy": last.get("ema_accuracy"),
            "best_accuracy": max((r["test_accuracy"] for r in evaluated), default=None),
            "last5": sum(r["test_accuracy"] for r in tail) / len(tail) if tail else None,
            "ema_accuracy_at": ema_at,
            "test_accuracy_at": test_at,
            "accuracy_at": dict(ema_at),  # = ema_accuracy_at, the name older readers use
            "report_metric": self.report_metric,
            "wall_time_s": round(self.wall_time(), 3),
            # rounds in which no client's update reached the model (strategies/base.py)
            "rounds_failed": sum(1 for r in self.records if r.get("round_failed")),
            # clients whose update did not reach the model in some round they trained in
            "client_failures": self.client_failures,
        }
        private = [
            r for r in self.records if r.get("dp_epsilon", None) is not None or "dp_delta" in r
        ]
        if private:  # privacy.dp: the budget spent by the end of the run (privacy.py)
            out["dp_epsilon"] = private[-1].get("dp_epsilon")
            out["dp_delta"] = private[-1].get("dp_delta")
        per_domain = last_k_per_domain(evaluated, LAST_K)
        if per_domain:
            out["last5_per_domain"] = per_domain
        out.update(domain_mean_summary(evaluated, self.target_rounds, reached, self.ema_factor))
        out.update(research_summary(self.records))
        return out

    def finish(self, model_state: dict | None = None, before_summary=None) -> dict:
        """Write the model, the plot and, last, ``summary.json`` (its appearance means
        every result of the run is on disk). ``before_summary(summary, plots)`` is called
        just before (the experiment trackers, ``fedrcl_flwr.tracking``)."""
        summary = self.summary()
        if model_state is not None:  # serialised in memory: a full disk names model.pt
            import io

            import torch

            buffer = io.BytesIO()
            torch.save(model_state, buffer)
            atomic_write_bytes(self.out_dir / MODEL_FILE, buffer.getbuffer())
        plot_accuracy(self.records, self.out_dir / PLOT_FILE, title=self.title)
        if before_summary is not None:
            before_summary(
                summary,
                sorted(p for p in self.out_dir.glob("*.png") if not p.name.endswith(".tmp.png")),
            )
        atomic_write_text(self.out_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
        return summary


def read_metrics(run_dir: Path) -> list[dict]:
    """The run's round records as far as they are well-formed (progress display and
    resume bookkeeping; ``fedrcl_flwr.report.reading.read_records`` is the strict reader): stops
    at a torn last line from a killed run, or at anything that is not a round record."""
    path = Path(run_dir) / METRICS_FILE
    try:
        if not path.is_file() or path.stat().st_size > (512 << 20):  # not a run's
            return []
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):  # an integer of over 4,300 digits too
                break  # a torn last line from a killed run
            rnd = rec.get("round") if isinstance(rec, dict) else None
            if not isinstance(rnd, int) or isinstance(rnd, bool) or not 0 <= rnd < 2**63:
                break
            out.append(rec)
    return out


def report_table(run_dirs: list[Path]) -> str:
    """Markdown table (method, strategy, EMA accuracy at each target round, final accuracy)."""
    rows = []
    targets: set[str] = set()
    for d in run_dirs:
        p = Path(d) / SUMMARY_FILE
        if not p.exists():
            raise FileNotFoundError(f"{d}: no {SUMMARY_FILE} (is this a finished run dir?)")
        s = json.loads(p.read_text())
        rows.append((Path(d).name, s))
        targets.update((s.get("accuracy_at") or {}).keys())
    tcols = sorted(targets, key=int)

    def pct(v):
        return "-" if v is None else f"{100 * v:.2f}"

    header = (
        ["run", "method", "strategy"]
        + [f"EMA@{t}" for t in tcols]
        + ["EMA final", "final acc", "rounds", "time (s)"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, s in rows:
        at = s.get("accuracy_at") or {}
        cells = [name, str(s.get("method")), str(s.get("strategy"))]
        cells += [pct(at.get(t)) for t in tcols]
        cells += [
            pct(s.get("ema_accuracy")),
            pct(s.get("final_accuracy")),
            str(s.get("rounds")),
            f"{s.get('wall_time_s', 0):.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
