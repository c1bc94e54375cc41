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
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedrcl_flwr.run.run_files import (  # noqa: F401 - the names' one home, re-exported
    CHECKPOINT_FILE,
    CONFIG_FILE,
    MARKER_FILE,
    METRICS_FILE,
    MODEL_FILE,
    PLOT_FILE,
    PLOT_TMP,
    RESULT_FILES,
    RUN_FILES,
    RUN_SUBDIRS,
    SUMMARY_FILE,
    TMP_SUFFIX,
    append_file,
    atomic_write_bytes,
    guarded_write,
    new_file,
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


def shows_ema(report_metric: str) -> bool:
    """Whether progress lines show the EMA accuracy: only for runs that report it
    (``evaluation.report_metric: ema@ROUND``, FedRCL's tables). The EMA trails the
    round's accuracy by about 1 / (1 - evaluation.ema) rounds (10 for 0.9), so beside it
    on a line of a run that reports something else it only suggested a gap;
    it is in ``metrics.jsonl`` and ``summary.json`` either way."""
    from fedrcl_flwr.config.catalog import ema_round

    return ema_round(str(report_metric or "")) is not None


def ema_note(factor: float, report_metric: str) -> str:
    """What ``ema`` on the progress lines is, printed once before them."""
    lag = 1.0 / (1.0 - factor) if factor < 1 else float("inf")
    return (
        f"'ema' is the reported metric ({report_metric}): EMA_t = {factor:g}·EMA_(t-1) + "
        f"{1 - factor:g}·acc_t from EMA_1 = acc_1, the exponential moving average "
        f"FedRCL reports; it trails 'acc' by about {lag:.0f} rounds"
    )


def format_round_line(
    rec: dict, total_rounds: int, show_ema: bool = False, eta_s: float | None = None
) -> str:
    """One concise progress line for a round (``ema`` only with ``show_ema``:
    :func:`shows_ema`; ``| ETA ...`` last when ``eta_s`` is given: :func:`round_eta`)."""
    parts = [f"round {rec['round']:>4}/{total_rounds}"]
    if rec.get("test_accuracy") is not None:
        parts.append(f"acc {100 * rec['test_accuracy']:6.2f}%")
    if show_ema and rec.get("ema_accuracy") is not None:
        parts.append(f"ema {100 * rec['ema_accuracy']:6.2f}%")
    if rec.get("test_loss") is not None:
        parts.append(f"test_loss {rec['test_loss']:.4f}")
    if rec.get("train_loss") is not None:
        parts.append(f"train_loss {rec['train_loss']:.4f}")
    if "dp_delta" in rec:  # privacy.dp: the budget spent so far
        eps = rec.get("dp_epsilon")
        parts.append(f"eps {eps:.2f}" if eps is not None else "eps inf")
    if rec.get("client_acc_mean") is not None:  # per-client evaluation (client_eval.py)
        parts.append(
            f"clients' acc {100 * rec['client_acc_mean']:.2f}% (worst 10% "
            f"{100 * rec['client_acc_worst10']:.2f}%)"
        )
    parts.append(f"clients {rec.get('num_clients', 0)}")
    if rec.get("secagg_clients") is not None:  # privacy.secagg: who is in the masked sum
        parts.append(f"SecAgg+ sum of {rec['secagg_clients']}")
    if rec.get("dropped"):  # unreliable clients (availability.py)
        parts.append(f"dropped {rec['dropped']}")
    if rec.get("failures"):
        parts.append(f"failures {rec['failures']}")
    if rec.get("weight_store"):  # strategies/round_records.py: what the weight store cost the round
        parts.append(f"weight store: {rec['weight_store']}")
    why = rec.get("failure_reason")
    if rec.get("round_failed") or (rec.get("failures") and not rec.get("num_clients")):
        # strategies/base.py: no client's update reached the model this round
        parts.append(f"ROUND FAILED (model unchanged): {why or 'every client failed'}")
    parts.append(f"{rec.get('round_time_s', 0.0):.1f}s")
    if eta_s is not None:
        parts.append(f"ETA {format_duration(eta_s)}")
    return " | ".join(parts)


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = int(round(max(float(seconds), 0.0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def round_eta(records: list[dict], total_rounds: int) -> float | None:
    """Seconds left after the last of ``records`` (the round records written by this
    process, in order): the rounds still to run times the wall-clock seconds per round
    between the first and the last of them (``wall_time_s``; the first round's own time,
    which holds the start of the clients' workers, is left out). ``None`` before two
    rounds have been recorded, and after the last round."""
    timed = [r for r in records if isinstance(r.get("wall_time_s"), (int, float))]
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    span = int(last["round"]) - int(first["round"])
    if span <= 0 or int(last["round"]) >= total_rounds:
        return None
    per_round = (float(last["wall_time_s"]) - float(first["wall_time_s"])) / span
    return max(per_round, 0.0) * (total_rounds - int(last["round"]))


LAST_K = 5  # FedCCL reports the mean of the last five communication rounds


def last_k_per_domain(evaluated: list[dict], k: int = LAST_K) -> dict:
    """Per domain, the mean of ``domain_accuracy[domain]`` over the last ``k`` evaluated
    rounds that report it (all of them if fewer)."""
    rounds = [r for r in evaluated if isinstance(r.get("domain_accuracy"), dict)][-k:]
    sums: dict = {}
    for r in rounds:
        for name, acc in r["domain_accuracy"].items():
            if acc is not None:
                sums.setdefault(str(name), []).append(float(acc))
    return {name: sum(v) / len(v) for name, v in sums.items()}


# ``domain_accuracy``'s entry beside the domains: their unweighted mean that round
# (fedrcl_flwr/evaluation.py evaluate_model), not a domain
DOMAIN_AVERAGE = "average"


def domains_of(per_domain: Any) -> dict:
    """A ``domain_accuracy`` (or ``last5_per_domain``) mapping without its
    :data:`DOMAIN_AVERAGE` entry: domain -> accuracy, numbers only."""
    if not isinstance(per_domain, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in per_domain.items()
        if k != DOMAIN_AVERAGE and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _domain_rounds(evaluated: Iterable[dict]) -> list[dict]:
    """The evaluated rounds with per-domain accuracy, each as ``{"round", "domains"}``."""
    out = []
    for r in evaluated:
        d = domains_of(r.get("domain_accuracy"))
        if d:
            out.append({"round": int(r["round"]), "domains": d})
    return out


def _mean(values: Iterable[float]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


def per_domain_values(evaluated: list[dict], metric: str, ema_factor: float = 0.9) -> dict:
    """Per domain (test-set order), the value of the pooled metric under ``metric``
    (``final``, ``best``, ``last5`` or ``ema@ROUND``, with or without ``_domain_mean``)
    computed from ``domain_accuracy`` of the evaluated rounds; ``{}`` when no round has
    it. ``final``: the last such round's; ``last5``: :func:`last_k_per_domain`;
    ``best``: the round with the highest domain mean; ``ema@ROUND``: each domain's EMA
    (``EMA_t = factor·EMA_(t-1) + (1 - factor)·acc_t``, started at its first value as
    :class:`fedrcl_flwr.evaluation.EMATracker`) over the rounds <= ROUND (the EMA is
    linear, so the mean of these is the EMA of the per-round domain mean). Whether the
    run reached ROUND is the caller's question."""
    from fedrcl_flwr.config.catalog import ema_round, pooled_metric

    rounds = _domain_rounds(evaluated)
    if not rounds:
        return {}
    base = pooled_metric(metric)
    if base == "final":
        return rounds[-1]["domains"]
    if base == "last5":
        return domains_of(last_k_per_domain([{"domain_accuracy": r["domains"]} for r in rounds]))
    if base == "best":
        return max(rounds, key=lambda r: _mean(r["domains"].values()) or 0.0)["domains"]
    target = ema_round(base)
    if target is None:
        raise ValueError(f"no per-domain value of metric {metric!r}")
    ema: dict = {}
    for r in rounds:
        if r["round"] > target:
            break
        for k, v in r["domains"].items():
            ema[k] = v if k not in ema else ema_factor * ema[k] + (1 - ema_factor) * v
    return ema


def domain_mean_value(evaluated: list[dict], metric: str, ema_factor: float = 0.9) -> float | None:
    """The papers' "Avg": the unweighted mean over domains of :func:`per_domain_values`
    (``None`` without per-domain accuracy)."""
    return _mean(per_domain_values(evaluated, metric, ema_factor).values())


def domain_mean_summary(
    evaluated: list[dict], target_rounds: Iterable[int], reached: int, ema_factor: float
) -> dict:
    """summary.json's domain-mean keys (none when no round has ``domain_accuracy``):
    ``final_domain_mean``, ``best_domain_mean``, ``last5_domain_mean``, and
    ``ema_domain_mean_at`` (target round -> ``ema@ROUND_domain_mean``, for the targets the
    run reached)."""
    if not _domain_rounds(evaluated):
        return {}
    out: dict[str, Any] = {
        f"{m}_domain_mean": domain_mean_value(evaluated, m, ema_factor)
        for m in ("final", "best", "last5")
    }
    out["ema_domain_mean_at"] = {
        str(t): domain_mean_value(evaluated, f"ema@{t}", ema_factor)
        for t in target_rounds
        if t <= reached and any(r["round"] <= t for r in _domain_rounds(evaluated))
    }
    return out


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


def always_failing(summary: dict) -> list[str]:
    """One phrase per client that failed in every round it was sampled (``summary.json``'s
    ``client_failures``, :meth:`RunRecorder.summary`): ``client 17 failed in 12 of 12
    rounds it was sampled: <its first error>``, in partition order. A client that failed
    in only some rounds is counted in ``summary.json`` and not named here."""
    out = []
    entries = summary.get("client_failures")
    for pid, entry in (entries if isinstance(entries, dict) else {}).items():
        try:
            failed, rounds = int(entry["failed"]), int(entry["rounds"])
            error = one_line(str(entry["first_error"]), 300)
        except (KeyError, TypeError, ValueError):
            continue
        if failed and failed >= rounds:
            out.append(
                f"client {pid} failed in {failed} of {rounds} "
                f"round{'s' if rounds != 1 else ''} it was sampled: {error}"
            )
    return out


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters (``...`` and the full length)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def research_summary(records: list[dict]) -> dict:
    """``summary.json`` entries of per-client evaluation (the ``client_acc_*`` of the last
    round that has them, and its ``client_acc_round``) and of unreliable clients
    (``dropped_total`` / ``late_total`` at the last record); nothing when the run has
    neither."""
    from fedrcl_flwr.config.catalog import CLIENT_STAT_KEYS as STAT_KEYS

    out: dict = {}
    with_clients = [r for r in records if r.get("client_acc_mean") is not None]
    if with_clients:
        last = with_clients[-1]
        out.update({k: last.get(k) for k in STAT_KEYS})
        out["client_acc_round"] = last["round"]
    with_drops = [r for r in records if "dropped_total" in r]
    if with_drops:
        out["dropped_total"] = with_drops[-1]["dropped_total"]
        if "late_total" in with_drops[-1]:
            out["late_total"] = with_drops[-1]["late_total"]
    return out


def reported_value(summary: dict, metric: str) -> float | None:
    """``summary.json``'s value of a report metric: final | best | last5 | ema@ROUND, each
    also with ``_domain_mean``."""
    from fedrcl_flwr.config.catalog import SUMMARY_METRICS, ema_round, is_domain_mean

    metric = str(metric or "final")
    target = ema_round(metric)
    if is_domain_mean(metric):
        if target is not None:
            return (summary.get("ema_domain_mean_at") or {}).get(str(target))
        return summary.get(metric)
    if target is not None:
        at = summary.get("ema_accuracy_at")
        if not isinstance(at, dict):  # a summary written before ema_accuracy_at
            at = summary.get("accuracy_at")
        return (at or {}).get(str(target))
    key = SUMMARY_METRICS.get(metric)
    return summary.get(key) if key else None


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


def run_title(cfg) -> str:
    """What a run's ``accuracy.png`` is of: ``name: method (+ optimizer) on dataset,
    partition (α), clients (per round), rounds``."""
    from fedrcl_flwr.config.catalog import PARTITION_SCHEMES, dataset_info

    method = cfg.client.method
    if cfg.server.strategy != "fedavg":
        method += f" + {cfg.server.strategy}"
    data = cfg.dataset.name
    info = dataset_info(data)
    key = info.location_key if info.titled else None
    where = getattr(cfg.dataset, key.removeprefix("dataset."), None) if key else None
    if where:
        data += f" {Path(str(where)).name}"
    p = cfg.partition
    part = PARTITION_SCHEMES.get(p.scheme, p.scheme)
    if p.scheme == "dirichlet" or (p.scheme == "domain" and not p.balanced):
        part += f" α={p.alpha:g}"
    elif p.scheme == "shards":
        part += f" γ={p.shards_per_client}"
    fed = cfg.federation
    return (
        f"{cfg.name}: {method} on {data}, {part}, {fed.num_clients} clients "
        f"({fed.sampled_per_round()} per round), {fed.rounds} rounds"
    )


def wrap_title(title: str, width_in: float, fontsize: float = 11) -> str:
    """``title`` broken into lines that fit a figure ``width_in`` inches wide (about
    0.55 · fontsize points per character), so that no title is cut at the edges."""
    import textwrap

    chars = max(20, int(width_in * 72 / (0.55 * fontsize)) - 2)
    return "\n".join(textwrap.wrap(title, chars)) if title else ""


def legend_below(ax, entries: int) -> None:
    """The axes' legend under them (never over the curves), in up to two columns."""
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=1 if entries < 3 else 2,
        fontsize=8,
        frameon=False,
    )


def plot_accuracy(records: list[dict], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rs = [r for r in records if r.get("test_accuracy") is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if rs:
        x = [r["round"] for r in rs]
        ax.plot(x, [100 * r["test_accuracy"] for r in rs], label="test accuracy", alpha=0.6)
        ax.plot(
            x,
            [100 * r["ema_accuracy"] for r in rs],
            label="EMA accuracy (moving average: trails the test accuracy)",
        )
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(wrap_title(title, 6.0, 10), fontsize=10)
    ax.grid(alpha=0.3)
    if rs:
        legend_below(ax, 2)
    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        with guarded_write(path, tmp):
            with new_file(tmp) as fh:
                fig.savefig(fh, format="png", dpi=100, bbox_inches="tight")
            os.replace(tmp, path)
    finally:
        plt.close(fig)


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
