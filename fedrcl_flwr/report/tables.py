"""Paper tables from run directories: ``fedrcl-flwr report`` and ``fedrcl-flwr plot``.

Runs are read from their ``config.yaml`` (the resolved experiment), ``summary.json`` and
``metrics.jsonl`` (the source of truth: every metric missing from the summary is computed
from it). Runs whose configurations differ only by ``seed`` (and output / simulation
resources / name) form a group; a group's cell is the mean and the sample standard
deviation (``ddof = 1``; none for one run) over its runs, in percent, with ``n`` the
number of runs that have the metric.

Rows and columns (:func:`group_runs`): a row is the run's ``label`` (a sweep's variant
label), else its method (``client.method``, prefixed by the server optimizer when it is
not ``fedavg``: ``fedacg+fedrcl``). Columns are the settings outside ``client`` /
``server`` that vary *within* a row (``alpha=0.05``); whatever else differs between rows
(a method's parameters, a model's projector, ...) is named beside the method, readably:
``fedprox (mu=0.01)``, ``univarfl (projector=256)``; a labelled row is named by its label
and what it is follows the table (``rows: univarfl_proj = univarfl (projector=256)``).
The table's title names what every run shares (dataset, partition and α, clients, rounds).
The best mean per column is marked. When the runs carry the paper's numbers (the
experiment's ``reference`` blocks, see ``fedrcl_flwr.config.check_reference``) for the
reported metric, the paper's value and our difference (ours - paper) stand beside ours.

Paired comparison (``report --vs ROW``, :func:`paired`): a seed fixes the partition and
the clients sampled in every round, identical for every method and strategy, so runs of
two rows in one column with the same seed form a pair. For each row and column: the
per-seed differences (row − ROW, points), their mean ± sample std, and a two-sided 95 %
Student-t interval for the mean difference (mean ± t_{0.975, n−1} · std / √n), beside
the unpaired means ± std of both rows.

Metrics (``--metric``): ``final`` (test accuracy of the last evaluated round), ``best``
(highest test accuracy), ``last5`` (mean test accuracy of the last five evaluated rounds;
FedCCL's "mean of the last five rounds"), ``ema@R`` (the EMA accuracy of the last
evaluated round <= R, FedRCL's "accuracy at R rounds"; missing for a run that never
reached round R). Per-client evaluation (``evaluation.per_client``): ``client_mean``,
``client_std``, ``client_worst10``, ``client_best10`` (the ``client_acc_*`` of the last
round that has them). Without ``--metric``: the runs' ``summary.json`` ``report_metric``,
else their reference's metric, else ``final``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedrcl_flwr.config import check_reference, flatten_keys
from fedrcl_flwr.config.catalog import (
    PARTITION_SCHEMES,
    dataset_info,
    ema_round,
    is_report_metric,
    metric_choices,
)
from fedrcl_flwr.errors import ConfigError, shown
from fedrcl_flwr.run.results import LAST_K
from fedrcl_flwr.run.run_files import CONFIG_FILE, METRICS_FILE, NOT_RUN_DIRS, SUMMARY_FILE

SKIP_DIRS = NOT_RUN_DIRS
# config sections that do not change what a run computes (or that name it)
NOT_A_SETTING = ("seed", "name", "label", "output", "simulation", "reference")
CONFIDENCE = 0.95  # of the paired t-interval


@dataclass
class Run:
    path: Path
    config: dict
    summary: dict
    records: Sequence  # a list, or the lazily parsed Records of a metrics.jsonl

    @property
    def method(self) -> str:
        return method_label(self.config, self.summary)


@dataclass
class Group:
    key: str
    runs: list
    config: dict
    row: str = ""
    col: str = ""
    values: list = field(default_factory=list)  # per run, None = missing
    paper: float | None = None
    source: str = ""
    what: str = ""  # what a labelled row is: method (what differs)
    flat: dict = field(default_factory=dict)  # its setting, dotted keys

    def _seed_values(self) -> list:
        """``[(seed or None, [values])]`` in run order: the runs that have the metric, those
        with the same seed together (a run without a seed alone)."""
        out: list = []
        index: dict = {}
        for run, v in zip(self.runs, self.values):
            if v is None:
                continue
            seed = run.config.get("seed")
            if not _is_number(seed):
                out.append((None, [v]))
            elif int(seed) in index:
                out[index[int(seed)]][1].append(v)
            else:
                index[int(seed)] = len(out)
                out.append((int(seed), [v]))
        return out

    @property
    def by_seed(self) -> dict:
        """seed -> value (the mean of the seed's duplicate runs), for the runs that have
        the metric and a seed."""
        return {s: sum(v) / len(v) for s, v in self._seed_values() if s is not None}

    @property
    def present(self) -> list:
        """The values the cell's statistics are over: one per distinct seed (runs of one
        setting with the same seed are duplicates, not replicates: they count once, as
        their mean), plus each run without a seed."""
        return [sum(v) / len(v) for _, v in self._seed_values()]

    @property
    def duplicates(self) -> dict:
        """seed -> number of runs, for the seeds that more than one run of the cell has."""
        return {s: len(v) for s, v in self._seed_values() if s is not None and len(v) > 1}

    @property
    def missing(self) -> int:
        """Runs of the cell without the metric."""
        return sum(v is None for v in self.values)

    @property
    def n(self) -> int:
        return len(self.present)

    @property
    def mean(self) -> float | None:
        p = self.present
        return sum(p) / len(p) if p else None

    @property
    def std(self) -> float | None:
        p = self.present
        if len(p) < 2:
            return None
        m = sum(p) / len(p)
        return math.sqrt(sum((x - m) ** 2 for x in p) / (len(p) - 1))

    @property
    def diff(self) -> float | None:
        return None if self.mean is None or self.paper is None else self.mean - self.paper

    @property
    def private(self) -> bool:
        """The runs ran with ``privacy.dp`` (their records carry ``dp_delta``)."""
        return any("dp_delta" in r.summary or _has_dp(r.records) for r in self.runs)

    @property
    def epsilon(self) -> float | None:
        """The largest final ε of the group's runs under ``privacy.dp`` (``inf`` for
        noise 0); ``None`` without DP."""
        if not self.private:
            return None
        eps = []
        for r in self.runs:
            recs = [x for x in r.records if "dp_delta" in x]
            v = r.summary.get("dp_epsilon", recs[-1].get("dp_epsilon") if recs else None)
            eps.append(math.inf if v is None else float(v))
        return max(eps)


# ----------------------------------------------------------------------------- reading


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


MAX_SUMMARY_BYTES = 16 << 20  # a run's summary.json is a few KB
MAX_METRICS_BYTES = 512 << 20  # metrics.jsonl: ~1-10 KB per round


def _read_text(path: Path, limit: int) -> str:
    from fedrcl_flwr.config import read_text_file

    return read_text_file(path, limit, "a run file")


def _accuracy_problem(v: Any) -> str | None:
    """Why ``v`` is not an accuracy (a finite fraction in [0, 1], or null)."""
    if v is None:
        return None
    if not _is_number(v):
        return "must be a number or null"
    # compared as they are: an integer of 400 digits is no float (math.isfinite overflows)
    if isinstance(v, float) and not math.isfinite(v) or not 0 <= v <= 1:
        return "must be a fraction in [0, 1] (or null)"
    return None


MAX_ROUND = 2**63 - 1  # a round number a run can write (a larger one is a damaged file)


def _round_problem(v: Any) -> str | None:
    if not _is_number(v) or (isinstance(v, float) and not math.isfinite(v)):
        return "must be a whole number >= 0"
    if v < 0 or v > MAX_ROUND or v != int(v):
        return "must be a whole number >= 0"
    return None


def _json(text: str, path: Path, where: str = ""):
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of over 4,300 digits
        raise ConfigError(f"{path}: {where}not valid JSON ({shown(str(exc), 200)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: {where}nested too deeply") from None


def read_summary(run_dir: Path) -> dict:
    path = run_dir / SUMMARY_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    data = _json(_read_text(path, MAX_SUMMARY_BYTES), path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a JSON object, got {type(data).__name__}")
    for k in ("final_accuracy", "best_accuracy", "ema_accuracy", "last5"):
        why = _accuracy_problem(data.get(k))
        if why:
            raise ConfigError(f"{path}: '{k}' {why}, got {shown(data[k])}")
    at = data.get("accuracy_at")
    if at is not None and (
        not isinstance(at, dict) or not all(_accuracy_problem(v) is None for v in at.values())
    ):
        raise ConfigError(
            f"{path}: 'accuracy_at' must map rounds to accuracies in [0, 1], got {shown(at)}"
        )
    if data.get("rounds") is not None and _round_problem(data["rounds"]):
        raise ConfigError(
            f"{path}: 'rounds' {_round_problem(data['rounds'])}, got {shown(data['rounds'])}"
        )
    return data


def _record_problem(rec: Any, where: str) -> str | None:
    """Why a parsed record of ``metrics.jsonl`` is not one (``where``: ``file:line``)."""
    if not isinstance(rec, dict) or _round_problem(rec.get("round")):
        return f"{where}: must be a JSON object with 'round' a whole number >= 0"
    for k in ("test_accuracy", "ema_accuracy"):
        why = _accuracy_problem(rec.get(k))
        if why:
            return f"{where}: '{k}' {why}, got {shown(rec[k])}"
    return None


def _parse_record(line: bytes | str, where: str) -> dict:
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where}: not UTF-8 text (byte 0x{line[exc.start]:02x}); save the file as UTF-8"
            ) from None
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits too
        raise ConfigError(f"{where}: not valid JSON ({shown(str(exc), 200)})") from None
    why = _record_problem(rec, where)
    if why:
        raise ConfigError(why)
    return rec


# a round of at most 18 digits (below MAX_ROUND); a longer one is parsed, and refused
_FRAME_RE = re.compile(rb'\{"round": (\d{1,18})[,}]')
_CHECKED_RE = re.compile(rb'"(?:test|ema)_accuracy": ([^,}]*)')


def _frame_ok(line: bytes) -> bool:
    """The quick check of one line as the run writes it (``{"round": N, ...}``, its
    accuracies null or numbers in [0, 1]); a line it cannot vouch for is parsed."""
    if not line.endswith(b"}") or not line.isascii():  # json.dumps writes ASCII
        return False
    found = _CHECKED_RE.findall(line)
    if len(found) > 2:
        return False
    for token in found:
        if token == b"null":
            continue
        if token[:1] not in b"0123456789":
            return False
        try:
            v = float(token)
        except ValueError:
            return False
        if not v <= 1.0:
            return False
    return True


class Records(Sequence):
    """The records of a ``metrics.jsonl`` (:func:`read_records`): every line framed and
    checked when the file is opened, parsed in full on first use (a report whose metric
    is in ``summary.json`` never needs them: bounded time on a file of any size)."""

    def __init__(self, path: Path, lines: int, end: int, rounds: list[int], dp: bool):
        self.path, self._lines, self._end, self.rounds = path, lines, end, rounds
        self.dp = dp  # a line carries dp_delta (privacy.dp; a key of the top level)
        self._parsed: list | None = None

    def _all(self) -> list:
        if self._parsed is None:
            with open(self.path, "rb") as fh:
                raw = fh.read(self._end)
            out = []
            for i, line in enumerate(raw.split(b"\n"), 1):
                if line.strip():
                    out.append(_parse_record(line, f"{self.path}:{i}"))
            self._parsed = out
        return self._parsed

    def __len__(self) -> int:
        return self._lines

    def __bool__(self) -> bool:
        return self._lines > 0

    def __getitem__(self, i):
        return self._all()[i]

    def __iter__(self):
        return iter(self._all())


def read_records(run_dir: Path) -> Sequence:
    """``metrics.jsonl``, checked line by line (:class:`Records`). A torn last line (a
    run killed while writing it: no final newline, not valid JSON) is left out with a
    warning on stderr; anything else malformed is one :class:`ConfigError` naming
    ``file:line``. Read in one pass, line by line (no copy of the whole file)."""
    path = run_dir / METRICS_FILE
    if not path.exists() and not path.is_symlink():
        return []
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    try:
        size = path.stat().st_size
        if size > MAX_METRICS_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes is too large for a run file (at most "
                f"{MAX_METRICS_BYTES} bytes)"
            )
        rounds: list[int] = []
        lines = end = 0
        dp = False
        with open(path, "rb") as fh:
            for i, raw in enumerate(fh, 1):
                line = raw.strip()
                if not raw.endswith(b"\n") and line:  # the last line, without its newline
                    try:
                        rec = json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                        _warn(
                            f"{path}:{i}: the last line is cut short (a run stopped while "
                            "writing it); it is left out"
                        )
                        break
                    except ValueError:  # whole, but a value JSON cannot take: refused below
                        pass
                    rec = _parse_record(line, f"{path}:{i}")
                    rounds.append(int(rec["round"]))
                elif line:
                    m = _FRAME_RE.match(line)
                    if m and _frame_ok(line):
                        rounds.append(int(m[1]))
                    else:
                        rounds.append(int(_parse_record(line, f"{path}:{i}")["round"]))
                lines += 1 if line else 0
                end += len(raw)
                dp = dp or b'"dp_delta"' in line
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return Records(path, lines, end, rounds, dp)


def _has_dp(records: Sequence) -> bool:
    if isinstance(records, Records):
        return records.dp
    return any("dp_delta" in x for x in records)


def _warn(text: str) -> None:
    import sys

    print(f"fedrcl-flwr: warning: {text}", file=sys.stderr)


def read_config(run_dir: Path) -> dict:
    """The run's ``config.yaml`` through the project's one hardened YAML reader
    (:func:`fedrcl_flwr.config.read_yaml`: size bound, UTF-8, no duplicate keys, alias
    expansion bounded, no recursive aliases)."""
    from fedrcl_flwr.config import read_yaml

    path = run_dir / CONFIG_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    data = read_yaml(path)
    for section, value in data.items():  # what grouping and labelling read
        if section in _SECTIONS and value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: '{section}' must be a mapping, got {type(value).__name__}")
    for section, key in (("client", "method"), ("server", "strategy")):
        v = (data.get(section) or {}).get(key)
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"{path}: '{section}.{key}' must be a string, got {v!r}")
    check_reference(data.get("reference"), str(path))
    return data


_SECTIONS = (
    "dataset",
    "partition",
    "model",
    "federation",
    "client",
    "server",
    "evaluation",
    "simulation",
    "output",
)
MAX_SCAN_DEPTH = 4  # a sweep's runs are OUT/<run>; room for nesting sweeps
MAX_SCAN_ENTRIES = 200_000  # directory entries looked at below one DIR


def _is_run(d: Path) -> bool:
    return any((d / f).is_file() for f in (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE))


def _dirs_below(d: Path) -> list[Path]:
    """Directories below ``d`` (links not followed), at most :data:`MAX_SCAN_DEPTH`
    levels deep, skipping the sweep's and runs' own sub-directories; a tree with more
    than :data:`MAX_SCAN_ENTRIES` entries is an error (``report /`` would scan a disk)."""
    out: list[Path] = []
    seen = 0
    for root, dirnames, filenames in os.walk(d, followlinks=False):
        depth = len(Path(root).relative_to(d).parts)
        seen += len(dirnames) + len(filenames)
        if seen > MAX_SCAN_ENTRIES:
            raise ConfigError(
                f"{d}: more than {MAX_SCAN_ENTRIES} files and directories "
                "below it; name a run directory or a sweep's --out"
            )
        dirnames[:] = sorted(
            n for n in dirnames if n not in SKIP_DIRS and not os.path.islink(os.path.join(root, n))
        )
        if depth >= MAX_SCAN_DEPTH:
            dirnames[:] = []
        out.extend(Path(root) / n for n in dirnames)
    return sorted(out)


def find_runs(dirs: list) -> list[tuple[Path, bool]]:
    """Run directories: each DIR itself, or every run below it (a sweep's --out); with
    whether the directory was named explicitly."""
    found: list[tuple[Path, bool]] = []
    for d in map(Path, dirs):
        if _is_run(d):
            found.append((d, True))
            continue
        below = [sub for sub in _dirs_below(d) if _is_run(sub)] if d.is_dir() else []
        if not below:
            raise ConfigError(
                f"{d}: no {SUMMARY_FILE} (is this a finished run dir, or a sweep's --out?)"
            )
        found.extend((b, False) for b in below)
    seen, out = set(), []
    for p, explicit in found:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            out.append((p, explicit))
    return out


def load_runs(dirs: list) -> list[Run]:
    """The runs with data; below a sweep's --out, runs not started yet are skipped (with
    a note on stderr), a directory named explicitly must have data."""
    runs, waiting = [], []
    for d, explicit in find_runs(dirs):
        run = Run(d, read_config(d), read_summary(d), read_records(d))
        if not run.summary and not run.records:
            if explicit:
                raise ConfigError(
                    f"{d}: no {SUMMARY_FILE} and no evaluated round in {METRICS_FILE} yet"
                )
            waiting.append(d)
            continue
        runs.append(run)
    if waiting:
        import sys

        print(
            f"fedrcl-flwr: {len(waiting)} run dir(s) without an evaluated round yet left "
            f"out (e.g. {waiting[0]})",
            file=sys.stderr,
        )
    if not runs:
        raise ConfigError(f"{', '.join(map(str, dirs))}: no run has an evaluated round yet")
    return runs


# ----------------------------------------------------------------------------- metrics


def check_metric(metric: str) -> str:
    if not is_report_metric(metric, per_client=True):
        raise ConfigError(f"--metric must be {metric_choices(per_client=True)}, got {metric!r}")
    return metric


def _evaluated(run: Run) -> list:
    return [r for r in run.records if r.get("test_accuracy") is not None]


def _last_round(run: Run) -> int:
    recs = run.records
    rounds = recs.rounds if isinstance(recs, Records) else [int(r["round"]) for r in recs]
    if rounds:
        return max(rounds)
    return int(run.summary.get("rounds") or 0)


def metric_value(run: Run, metric: str) -> float | None:
    """The run's value of ``metric`` as a fraction in [0, 1], or None (missing)."""
    s = run.summary
    if metric == "final":
        if s.get("final_accuracy") is not None:
            return float(s["final_accuracy"])
        ev = _evaluated(run)
        return float(ev[-1]["test_accuracy"]) if ev else None
    if metric == "best":
        if s.get("best_accuracy") is not None:
            return float(s["best_accuracy"])
        ev = _evaluated(run)
        return max(float(r["test_accuracy"]) for r in ev) if ev else None
    if metric == "last5":
        if s.get("last5") is not None:
            return float(s["last5"])
        tail = _evaluated(run)[-LAST_K:]
        return sum(float(r["test_accuracy"]) for r in tail) / len(tail) if tail else None
    if metric.startswith("client_"):  # per-client evaluation: its last evaluated round
        key = "client_acc_" + metric[len("client_") :]
        if _is_number(s.get(key)):
            return float(s[key])
        with_key = [r for r in run.records if _is_number(r.get(key))]
        return float(with_key[-1][key]) if with_key else None
    target = ema_round(metric)
    if target is None:  # every other metric returned above
        raise ValueError(f"unknown report metric {metric!r}")
    if _last_round(run) < target:
        return None  # never reached round R
    at = s.get("accuracy_at") or {}
    if at.get(str(target)) is not None:
        return float(at[str(target)])
    upto = [
        r
        for r in _evaluated(run)
        if int(r["round"]) <= target and r.get("ema_accuracy") is not None
    ]
    return float(upto[-1]["ema_accuracy"]) if upto else None


def default_metric(runs: list[Run]) -> str:
    """The runs' ``report_metric`` (summary.json), else their reference's, else final."""
    for run in runs:
        m = run.summary.get("report_metric")
        if is_report_metric(m, per_client=True):
            return str(m)
    for run in runs:
        blocks = check_reference(run.config.get("reference"), str(run.path / CONFIG_FILE))
        if blocks:
            return blocks[0]["metric"]
    return "final"


# ----------------------------------------------------------------------------- grouping


def method_label(config: dict, summary: dict | None = None) -> str:
    summary = summary or {}
    method = (config.get("client") or {}).get("method") or summary.get("method") or "?"
    strategy = (config.get("server") or {}).get("strategy") or summary.get("strategy") or "fedavg"
    return str(method) if strategy == "fedavg" else f"{strategy}+{method}"


def _setting(config: dict, summary: dict) -> dict:
    if not config:  # hand-made run dirs without a config: method and strategy only
        return {
            "client.method": summary.get("method"),
            "server.strategy": summary.get("strategy") or "fedavg",
        }
    return {k: v for k, v in config.items() if k not in NOT_A_SETTING}


def _jkey(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _fmt_val(v: Any, key: str = "") -> str:
    if v is None:
        return "none"
    if isinstance(v, str) and key.endswith((".path", ".root")) and "/" in v:
        return Path(v).name or v  # a file's name says which data; the path is noise
    if isinstance(v, (list, dict)):
        return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()
    return str(v)


def _short(key: str) -> str:
    if key == "dataset.path":
        return "data"
    parts = key.split(".")
    if len(parts) > 1 and parts[-1] == "name":
        return parts[-2]
    if parts[0] in ("client", "server") and len(parts) > 2 and parts[1] == "params":
        return ".".join(parts[2:])
    if parts[0] == "privacy" and len(parts) > 1:  # dp.noise_multiplier, secagg
        return ".".join(parts[1:])
    return parts[-1]


def _short_names(keys: list) -> dict:
    """Each key's short name (:func:`_short`), the dotted key where two would collide."""
    shorts = [_short(k) for k in keys]
    return {k: (s if shorts.count(s) == 1 else k) for k, s in zip(keys, shorts)}


def _describe(items: list, names: dict) -> str:
    return ", ".join(f"{names[k]}={_fmt_val(v, k)}" for k, v in items)


def group_runs(runs: list[Run]) -> list[Group]:
    """Group runs that differ only by seed, then name rows and columns (module docstring)."""
    groups: dict[str, Group] = {}
    for run in runs:
        setting = _setting(run.config, run.summary)
        label = run.config.get("label")
        key = _jkey([label, setting])
        if key not in groups:
            groups[key] = Group(
                key,
                [],
                run.config
                or {
                    "client": {"method": run.summary.get("method")},
                    "server": {"strategy": run.summary.get("strategy") or "fedavg"},
                },
            )
        groups[key].runs.append(run)
    gs = list(groups.values())
    for g in gs:
        g.flat = flatten_keys(_setting(g.config, g.runs[0].summary))
    keys = list(dict.fromkeys(k for g in gs for k in g.flat))
    vary = [k for k in keys if len({_jkey(g.flat.get(k)) for g in gs}) > 1]
    ident = {"client.method", "server.strategy"}

    def base(g: Group) -> str:
        return str(g.config.get("label") or method_label(g.config, g.runs[0].summary))

    def varies_within_a_row(k: str) -> bool:
        seen: dict = {}
        for g in gs:
            seen.setdefault(base(g), set()).add(_jkey(g.flat.get(k)))
        return any(len(v) > 1 for v in seen.values())

    col_keys = [
        k for k in vary if not k.startswith(("client.", "server.")) and varies_within_a_row(k)
    ]
    attr_keys = [k for k in vary if k not in col_keys and k not in ident]
    names = _short_names(col_keys + attr_keys)
    for g in gs:
        # a key the group's config does not have (a sub-key of a mapping that is null
        # there, e.g. privacy.dp.mode without privacy.dp) is left out of its label
        g.col = _describe([(k, g.flat[k]) for k in col_keys if k in g.flat], names)
        method = method_label(g.config, g.runs[0].summary)
        attrs = [(k, g.flat.get(k)) for k in attr_keys if g.flat.get(k) is not None]
        g.what = f"{method} ({_describe(attrs, names)})" if attrs else method
        label = g.config.get("label")
        if not label:
            g.row = g.what
            continue
        # a labelled row: the label, plus what tells apart groups that share it
        same = [h for h in gs if h.config.get("label") == label]
        split = [(k, v) for k, v in attrs if len({_jkey(h.flat.get(k)) for h in same}) > 1]
        g.row = f"{label} ({_describe(split, names)})" if split else str(label)
    return gs


_VARIES = object()


def setting_title(groups: list[Group]) -> str:
    """What every run of the table shares, in words: dataset, partition (and α),
    clients per round, rounds — the settings that vary are the columns instead."""

    def common(key: str) -> Any:
        vals = {_jkey(g.flat.get(key)) for g in groups}
        return groups[0].flat.get(key) if len(vals) == 1 else _VARIES

    parts = []
    name = common("dataset.name")
    if isinstance(name, str):
        info = dataset_info(name)
        path = common(info.location_key) if info.titled and info.location_key else None
        if isinstance(path, str):
            parts.append(f"{name} {Path(path).name}")
        else:
            parts.append(name)
    scheme = common("partition.scheme")
    if isinstance(scheme, str):
        text = PARTITION_SCHEMES.get(scheme, scheme)
        alpha, gamma = common("partition.alpha"), common("partition.shards_per_client")
        balanced = common("partition.balanced")
        if scheme == "dirichlet" and _is_number(alpha):
            text += f" α={alpha:g}"
        elif scheme == "domain" and balanced is False and _is_number(alpha):
            text += f" (imbalanced, α={alpha:g})"
        elif scheme == "shards" and _is_number(gamma):
            text += f" γ={gamma:g}"
        parts.append(text)
    clients = common("federation.num_clients")
    if _is_number(clients):
        per, frac = common("federation.clients_per_round"), common("federation.participation")
        text = f"{clients} clients"
        if _is_number(per):
            text += f", {per} per round"
        elif _is_number(frac):
            text += f", {100 * frac:g} % per round"
        parts.append(text)
    rounds = common("federation.rounds")
    if _is_number(rounds):
        parts.append(f"{rounds} rounds")
    return ", ".join(parts)


def _resolved_params(method: str | None, params: Any) -> Any:
    """``client.params`` merged over the method's declared defaults (its class's
    ``defaults`` / ``rules``: this imports the client class, and so torch and Flower, which
    is why only a reference's ``when: {client.params: ...}`` calls it); as written for an
    unknown method or invalid parameters."""
    if method is None:  # no client.method in the run's config: nothing to resolve
        return params or {}
    try:
        from clients import CLIENTS
        from fedrcl_flwr.components import resolve_params

        defaults, rules = CLIENTS.params(method)
        return resolve_params(
            "client.params", f"method '{method}'", defaults, rules, dict(params or {})
        )
    except Exception:  # noqa: BLE001 - unknown method / params: compare as written
        return params or {}


def _when_matches(when: dict, config: dict) -> bool:
    method = (config.get("client") or {}).get("method")
    for key, want in (when or {}).items():
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if key == "client.params":
            if _resolved_params(method, node) != _resolved_params(method, want):
                return False
        elif (
            isinstance(want, (int, float))
            and isinstance(node, (int, float))
            and not isinstance(want, bool)
        ):
            if not math.isclose(float(node), float(want)):
                return False
        elif _jkey(node) != _jkey(want):
            return False
    return True


def paper_value(group: Group, metric: str) -> tuple[float | None, str]:
    """The paper's number (fraction) for this group and metric, and its source."""
    label = method_label(group.config, group.runs[0].summary)
    blocks = check_reference(group.config.get("reference"), str(group.runs[0].path))
    for b in blocks:
        if (
            b["metric"] == metric
            and label in b["values"]
            and _when_matches(b.get("when") or {}, group.config)
            and b["values"][label] is not None
        ):
            return float(b["values"][label]) / 100.0, b["source"]
    return None, ""


def build_table(dirs: list, metric: str | None = None) -> tuple[list[Group], str]:
    runs = load_runs(dirs)
    metric = check_metric(metric) if metric else default_metric(runs)
    groups = group_runs(runs)
    for g in groups:
        g.values = [metric_value(r, metric) for r in g.runs]
        g.paper, g.source = paper_value(g, metric)
    return groups, metric


@dataclass
class Paired:
    """One row's paired differences to the reference row in one column (fractions)."""

    group: Group
    ref: Group
    diffs: dict  # seed -> group value - reference value

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float | None:
        d = list(self.diffs.values())
        return sum(d) / len(d) if d else None

    @property
    def std(self) -> float | None:
        d = list(self.diffs.values())
        if len(d) < 2:
            return None
        m = sum(d) / len(d)
        return math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))

    @property
    def interval(self) -> tuple[float, float] | None:
        """Two-sided :data:`CONFIDENCE` Student-t interval for the mean difference."""
        mean, std = self.mean, self.std
        if self.n < 2 or mean is None or std is None:  # both set from 2 differences on
            return None
        from scipy.stats import t

        half = float(t.ppf(0.5 + CONFIDENCE / 2, self.n - 1)) * std / math.sqrt(self.n)
        return mean - half, mean + half


def find_row(groups: list[Group], name: str) -> str:
    """The row ``--vs NAME`` means: a row's full name, else its label or method when
    that picks one row."""
    rows = list(dict.fromkeys(g.row for g in groups))
    if name in rows:
        return name
    hits = list(
        dict.fromkeys(
            g.row
            for g in groups
            if name in (g.config.get("label"), method_label(g.config, g.runs[0].summary))
        )
    )
    if len(hits) == 1:
        return hits[0]
    what = "matches several rows" if hits else "is not a row of this table"
    raise ConfigError(f"--vs {name!r} {what}; rows: {', '.join(rows)}")


def paired(groups: list[Group], vs: str) -> list[Paired]:
    """Every other row's per-seed differences to row ``vs``, column by column."""
    ref_row = find_row(groups, vs)
    refs = {g.col: g for g in groups if g.row == ref_row}
    rows, cols = _layout(groups)[:2]
    groups = sorted(groups, key=lambda g: (rows.index(g.row), cols.index(g.col)))
    out = []
    for g in groups:
        ref = refs.get(g.col)
        if g.row == ref_row or ref is None:
            continue
        mine, theirs = g.by_seed, ref.by_seed
        out.append(Paired(g, ref, {s: mine[s] - theirs[s] for s in sorted(mine) if s in theirs}))
    return out


# ----------------------------------------------------------------------------- output


def _layout(groups: list[Group]):
    rows = list(dict.fromkeys(g.row for g in groups))
    cols = list(dict.fromkeys(g.col for g in groups))
    cell = {(g.row, g.col): g for g in groups}
    best = {}
    for c in cols:
        means = [g.mean for g in groups if g.col == c and g.mean is not None]
        best[c] = max(means) if means else None
    with_paper = {c for c in cols if any(g.paper is not None for g in groups if g.col == c)}
    return rows, cols, cell, best, with_paper


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    x = 100 * v
    if abs(x) < 0.005:
        x = 0.0  # no "-0.00" from a difference that is zero up to rounding
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _ours(g: Group | None, best: float | None, bold: tuple[str, str], pm: str) -> str:
    if g is None:
        return ""
    if g.mean is None:
        return "missing"
    text = _pct(g.mean)
    if g.std is not None:
        text += f" {pm} {_pct(g.std)}"
    missing = g.missing
    text += f" (n={g.n}" + (f", {missing} missing" if missing else "") + _dup(g) + _eps(g) + ")"
    if best is not None and math.isclose(g.mean, best):
        text = f"{bold[0]}{text}{bold[1]}"
    return text


def _dup(g: Group) -> str:
    """``, duplicates: seed 0 ×2`` where runs share a seed (they count once in n)."""
    d = g.duplicates
    if not d:
        return ""
    return ", duplicates: " + ", ".join(f"seed {s} ×{k}" for s, k in d.items())


def _eps(g: Group, fmt: str = ", ε≤{}") -> str:
    """The group's privacy budget (``privacy.dp``), empty without DP."""
    e = g.epsilon
    return "" if e is None else fmt.format("∞" if math.isinf(e) else f"{e:.2f}")


def _sources(groups: list[Group]) -> str:
    src = sorted({g.source for g in groups if g.source})
    return ", ".join(src)


def _rows_note(groups: list[Group]) -> str:
    """What each labelled row is, where its label does not say it already."""
    seen, parts = set(), []
    for g in groups:
        if g.config.get("label") and g.row != g.what and g.row not in seen:
            seen.add(g.row)
            parts.append(f"{g.row} = {g.what}")
    return "; ".join(parts)


def _ci_text(p: Paired) -> str:
    lo_hi = p.interval
    return f"[{_pct(lo_hi[0], True)}, {_pct(lo_hi[1], True)}]" if lo_hi else "—"


def _unpaired_text(p: Paired, pm: str = "±") -> str:
    def one(g: Group) -> str:
        if g.mean is None:
            return "missing"
        return _pct(g.mean) + (f" {pm} {_pct(g.std)}" if g.std is not None else "")

    return f"{one(p.group)} vs {one(p.ref)}"


_MD_SPECIAL = re.compile(r"([\\`*<>\[\]|#])")


def _md(text: Any) -> str:
    """A label as Markdown text: the characters that would end a table cell or start
    markup (``|``, ``*``, `````, ``[``, ``]``, ``<``, ``>``, ``#``, ``\\``)
    backslash-escaped, line breaks as spaces (a label is the user's: a run's ``label``,
    a method or a setting value)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def format_paired_markdown(pairs: list[Paired], vs: str, metric: str) -> str:
    level = f"{100 * CONFIDENCE:g} %"
    lines = [
        f"Paired with {_md(vs)} (the same seed: the same partition and the same clients in "
        f"every round), {metric} difference in points:",
        "",
        f"| method | setting | per seed (seed: diff) | mean ± std | {level} CI | n | "
        f"unpaired (this vs {_md(vs)}) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        per = ", ".join(f"{s}: {_pct(d, True)}" for s, d in p.diffs.items()) or "no common seed"
        mean = (
            ""
            if p.mean is None
            else _pct(p.mean, True) + (f" ± {_pct(p.std)}" if p.std is not None else "")
        )
        lines.append(
            f"| {_md(p.group.row)} | {_md(p.group.col or metric)} | {per} | {mean} | "
            f"{_ci_text(p)} | {p.n} | {_unpaired_text(p)} |"
        )
    lines += [
        "",
        f"CI: two-sided {level} Student-t interval of the mean paired difference, "
        "mean ± t(n−1) · std / √n (none for n < 2); std: sample std (n − 1).",
    ]
    return "\n".join(lines)


def format_markdown(groups: list[Group], metric: str) -> str:
    rows, cols, cell, best, with_paper = _layout(groups)
    header = ["method"]
    for c in cols:
        name = _md(c or metric)
        header.append(name)
        if c in with_paper:
            header += [f"{name} paper", f"{name} diff"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [_md(r)]
        for c in cols:
            g = cell.get((r, c))
            cells.append(_ours(g, best[c], ("**", "**"), "±"))
            if c in with_paper:
                cells += [_pct(g.paper) if g else "", _pct(g.diff, True) if g else ""]
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        f"\nmetric: {metric}; mean ± sample std over seeds (%), n distinct seeds; best per "
        "column in bold"
    )
    if any(g.duplicates for g in groups):
        note += (
            "; duplicates: runs of one setting with the same seed repeat one experiment "
            "(not a replicate): their mean counts once"
        )
    if any(g.private for g in groups):
        note += "; ε: the largest (ε, δ)-DP budget of the cell's runs (privacy.dp)"
    if _sources(groups):
        note += f"; paper: {_sources(groups)}; diff = ours - paper"
    if _rows_note(groups):
        note += f"\nrows: {_md(_rows_note(groups))}"
    title = setting_title(groups)
    head = f"**{_md(title)}** ({metric})\n\n" if title else ""
    return head + "\n".join(lines) + "\n" + note


def format_csv(groups: list[Group], metric: str, pairs: list | None = None, vs: str = "") -> str:
    """One row per group; with ``--vs`` also the paired columns (empty for the reference
    row): ``vs, paired_n, paired_mean, paired_std, ci_low, ci_high, per_seed``."""
    _, cols, _, best, _ = _layout(groups)
    by_group = {id(p.group): p for p in pairs or []}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    private = any(g.private for g in groups)  # privacy.dp: one more column, dp_epsilon
    head = [
        "method",
        "setting",
        "metric",
        "n",
        "missing",
        "mean",
        "std",
        "best",
        "paper",
        "diff",
        "source",
        "runs",
    ] + (["dp_epsilon"] if private else [])
    if pairs is not None:
        head += ["vs", "paired_n", "paired_mean", "paired_std", "ci_low", "ci_high", "per_seed"]
    w.writerow(head)
    for g in groups:
        is_best = (
            g.mean is not None and best[g.col] is not None and math.isclose(g.mean, best[g.col])
        )
        row = [
            g.row,
            g.col,
            metric,
            g.n,
            g.missing,
            _pct(g.mean),
            _pct(g.std),
            int(is_best),
            _pct(g.paper),
            _pct(g.diff, True),
            g.source,
            ";".join(str(r.path) for r in g.runs),
        ] + ([_eps(g, "{}")] if private else [])
        if pairs is not None:
            p = by_group.get(id(g))
            ci = p.interval if p else None
            row += [
                vs,
                p.n if p else "",
                _pct(p.mean, True) if p else "",
                _pct(p.std) if p else "",
                _pct(ci[0], True) if ci else "",
                _pct(ci[1], True) if ci else "",
                ";".join(f"{s}:{_pct(d, True)}" for s, d in p.diffs.items()) if p else "",
            ]
        w.writerow(row)
    return buf.getvalue()


def _tex(s: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("$", r"\$"),
    ):
        s = s.replace(a, b)
    return s


def format_latex(groups: list[Group], metric: str) -> str:
    rows, cols, cell, best, with_paper = _layout(groups)
    spec = "l" + "".join("rrr" if c in with_paper else "r" for c in cols)
    head = ["Method"]
    for c in cols:
        head.append(_tex(c or metric))
        if c in with_paper:
            head += ["Paper", r"$\Delta$"]
    out = [r"\begin{tabular}{" + spec + "}", r"\toprule", " & ".join(head) + r" \\", r"\midrule"]
    for r in rows:
        cells = [_tex(r)]
        for c in cols:
            g = cell.get((r, c))
            if g is None or g.mean is None:
                cells.append("--" if g is None else "missing")
            else:
                text = _pct(g.mean) + (rf" \pm {_pct(g.std)}" if g.std is not None else "")
                text += _eps(g, r"\,(\varepsilon\le {})").replace("∞", r"\infty")
                if best[c] is not None and math.isclose(g.mean, best[c]):
                    text = rf"\mathbf{{{text}}}"
                cells.append(f"${text}$")
            if c in with_paper:
                cells += [
                    _pct(g.paper) if g else "",
                    f"${_pct(g.diff, True)}$" if g and g.diff is not None else "",
                ]
        out.append(" & ".join(cells) + r" \\")
    out += [
        r"\bottomrule",
        r"\end{tabular}",
        f"% metric: {metric}; mean $\\pm$ sample std over seeds (%); n per cell: "
        + ", ".join(f"{_tex(g.row)}/{_tex(g.col or metric)}={g.n}" for g in groups),
    ]
    if setting_title(groups):
        out.append(f"% setting: {_tex(setting_title(groups))}")
    if _rows_note(groups):
        out.append(f"% rows: {_tex(_rows_note(groups))}")
    return "\n".join(out) + "\n"


def format_paired_latex(pairs: list[Paired], vs: str, metric: str) -> str:
    out = [
        r"\begin{tabular}{llrrr}",
        r"\toprule",
        rf"Method & Setting & $\Delta$ vs {_tex(vs)} & {100 * CONFIDENCE:g}\% CI & $n$ \\",
        r"\midrule",
    ]
    for p in pairs:
        mean = (
            "--"
            if p.mean is None
            else _pct(p.mean, True) + (rf" \pm {_pct(p.std)}" if p.std is not None else "")
        )
        ci = p.interval
        out.append(
            f"{_tex(p.group.row)} & {_tex(p.group.col or metric)} & ${mean}$ & "
            + (f"$[{_pct(ci[0], True)}, {_pct(ci[1], True)}]$" if ci else "--")
            + rf" & {p.n} \\"
        )
    out += [
        r"\bottomrule",
        r"\end{tabular}",
        f"% paired by seed, {metric} difference in points, mean $\\pm$ sample std; CI: "
        f"two-sided Student-t interval of the mean difference",
    ]
    return "\n".join(out) + "\n"


FORMATS = {"markdown": format_markdown, "csv": format_csv, "latex": format_latex}


def report(
    dirs: list,
    fmt: str = "markdown",
    metric: str | None = None,
    vs: str | None = None,
    notes: list | None = None,
) -> str:
    """The table of ``dirs`` in ``fmt``; with ``vs`` also the paired comparison. A note
    that is not part of a csv / latex table (``--vs`` with one row) goes to ``notes``."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    groups, metric = build_table(dirs, metric)
    if vs is None:
        return FORMATS[fmt](groups, metric)
    ref = find_row(groups, vs)
    if len({g.row for g in groups}) < 2:
        line = f"--vs {vs}: nothing to compare: the table has one row ({ref})"
        if fmt == "markdown":
            return format_markdown(groups, metric) + "\n\n" + line
        if notes is not None:
            notes.append(line)
        return FORMATS[fmt](groups, metric)
    pairs = paired(groups, vs)
    if fmt == "csv":
        return format_csv(groups, metric, pairs, ref)
    if fmt == "latex":
        return format_latex(groups, metric) + "\n" + format_paired_latex(pairs, ref, metric)
    return format_markdown(groups, metric) + "\n\n" + format_paired_markdown(pairs, ref, metric)


# ----------------------------------------------------------------------------- plots


def default_plot_out(dirs: list) -> Path:
    """Where ``plot DIR...`` writes without ``--out``: beside the run or sweep directory,
    named after it (``plot runs/quickstart`` -> ``runs/quickstart_curves.png`` / ``.pdf``);
    for several directories, ``accuracy_curves`` in the directory that holds them all."""
    paths = [Path(d).expanduser().resolve() for d in dirs]
    if len(paths) == 1:
        return paths[0].parent / f"{paths[0].name or 'runs'}_curves"
    return Path(os.path.commonpath([str(p.parent) for p in paths])) / "accuracy_curves"


def plot_files(out: Path) -> list[Path]:
    """The files ``plot --out OUT`` writes: ``OUT.png`` and ``OUT.pdf`` (a ``.png`` /
    ``.pdf`` suffix of ``OUT`` is dropped first)."""
    out = Path(out).expanduser()
    stem = out.with_suffix("") if out.suffix.lower() in (".png", ".pdf") else out
    return [stem.with_name(stem.name + ext) for ext in (".png", ".pdf")]


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def curves_figure(groups: list[Group], metric_key: str = "test_accuracy"):
    """The figure of :func:`plot_groups`: one panel per column (setting), one line per
    row (mean over seeds) with a ±std band. Accuracy bands are clipped to [0, 100]; every
    panel shares one y-range (the panels are settings of one study: the same scale lets
    them be compared at a glance); each row has its own colour, line style and marker
    (a line hidden under another stays visible at its markers); the title names what
    the runs share and the panels what differs. (Long because matplotlib is set up call by
    call; every step is one styling decision named above.)"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    from fedrcl_flwr.run.results import legend_below, wrap_title

    cols = list(dict.fromkeys(g.col for g in groups))
    rows = list(dict.fromkeys(g.row for g in groups))
    style = {
        r: dict(
            color=plt.cm.tab10(i % 10),
            linestyle=LINESTYLES[i % len(LINESTYLES)],
            marker=MARKERS[i % len(MARKERS)],
        )
        for i, r in enumerate(rows)
    }
    percent = metric_key.endswith("accuracy")
    ncol = min(len(cols), 3)
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(
        nrow,
        ncol,
        figsize=(5 * ncol, 4.6 * nrow),
        squeeze=False,
        sharey=True,
        layout="constrained",  # room for the wrapped titles and the legends below
    )
    lows, highs = [], []
    for ax, c in zip(axes.flat, cols):
        for g in (g for g in groups if g.col == c):
            rounds, mean, std = _mean_curve(g, metric_key, 100.0 if percent else 1.0)
            if not rounds:
                continue
            lo, hi = mean - std, mean + std
            if percent:
                lo, hi = np.clip(lo, 0.0, 100.0), np.clip(hi, 0.0, 100.0)
            lows.append(float(lo.min()))
            highs.append(float(hi.max()))
            st = style[g.row]
            ax.plot(
                rounds,
                mean,
                color=st["color"],
                linestyle=st["linestyle"],
                marker=st["marker"],
                markersize=4,
                markevery=max(1, len(rounds) // 10),
                linewidth=1.5,
                label=f"{g.row} (n={len({_jkey(r.config.get('seed')) for r in g.runs})})",
            )
            ax.fill_between(rounds, lo, hi, color=st["color"], alpha=0.15, linewidth=0)
        ax.set_title(wrap_title(c or "", 5.0, 10), fontsize=10)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            legend_below(ax, len(ax.get_legend_handles_labels()[0]))
    for ax in axes[:, 0]:
        ax.set_ylabel(
            "test accuracy (%)"
            if metric_key == "test_accuracy"
            else metric_key + (" (%)" if percent else "")
        )
    if lows:
        pad = 0.03 * max(max(highs) - min(lows), 1.0)
        y0, y1 = min(lows) - pad, max(highs) + pad
        if percent:
            y0, y1 = max(y0, 0.0), min(y1, 100.0)
        axes.flat[0].set_ylim(y0, y1)  # shared by every panel
    for ax in list(axes.flat)[len(cols) :]:
        ax.set_visible(False)
    title = setting_title(groups)
    if len(cols) == 1 and cols[0]:  # one panel: its setting belongs in the one title
        title = f"{title}, {cols[0]}" if title else cols[0]
        axes.flat[0].set_title("")
    fig.suptitle(
        wrap_title((title + ": " if title else "") + "mean ± std over seeds", 5.0 * ncol, 11),
        fontsize=11,
    )
    return fig


def _mean_curve(g: Group, metric_key: str, scale: float) -> tuple[list, Any, Any]:
    """Rounds, mean and sample std (``ddof = 1``; 0 for one run) over the group's runs of
    ``metric_key`` per round, times ``scale``."""
    import numpy as np

    curves = []
    for run in g.runs:
        recs = [r for r in run.records if r.get(metric_key) is not None]
        curves.append({int(r["round"]): float(r[metric_key]) for r in recs})
    rounds = sorted(set().union(*curves)) if curves else []
    mean, std = [], []
    for rd in rounds:
        vs = [cv[rd] for cv in curves if rd in cv]
        mean.append(scale * float(np.mean(vs)))
        std.append(scale * float(np.std(vs, ddof=1)) if len(vs) > 1 else 0.0)
    return rounds, np.array(mean), np.array(std)


def plot_groups(dirs: list, out: Path, metric_key: str = "test_accuracy") -> list[Path]:
    """Accuracy per round, one line per row (mean over seeds, ±std band), one panel per
    setting (:func:`curves_figure`); written as ``out`` with suffix .png and .pdf. With
    per-client evaluation also ``out_clients`` (:func:`plot_client_distribution`)."""
    groups = group_runs(load_runs(dirs))
    fig = curves_figure(groups, metric_key)
    written = plot_files(out)
    written[0].parent.mkdir(parents=True, exist_ok=True)
    _save_figure(fig, written)
    return written + plot_client_distribution(groups, client_plot_files(out))


def client_plot_files(out: Path) -> list[Path]:
    """The per-client distribution figure's files ``plot --out OUT`` writes when runs
    have per-client records: ``OUT_clients.png`` and ``OUT_clients.pdf``."""
    return [p.with_name(p.stem + "_clients" + p.suffix) for p in plot_files(out)]


def _save_figure(fig, paths: list[Path]) -> None:
    """Write ``fig`` to each of ``paths``, close it."""
    import matplotlib.pyplot as plt

    for p in paths:
        fig.savefig(p, dpi=120, bbox_inches="tight")
    plt.close(fig)


def last_client_accuracies(run: Run) -> list[float]:
    """The per-client accuracies (``client_accuracy``) of the run's last round that has
    them (per-client evaluation), as fractions; empty when it has none."""
    for r in reversed(run.records):
        per = r.get("client_accuracy")
        if isinstance(per, dict) and per:
            return [float(v) for v in per.values() if _is_number(v)]
    return []


def plot_client_distribution(groups: list[Group], paths: list[Path]) -> list[Path]:
    """Per-client accuracy distribution (``evaluation.per_client``): one panel per
    setting, one box per row over the clients of its runs' last per-client evaluation
    (seeds pooled), each client a dot, the mean a triangle. Written to ``paths`` (returned);
    nothing (``[]``) when no run has per-client records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = {
        (g.row, g.col): [100 * a for run in g.runs for a in last_client_accuracies(run)]
        for g in groups
    }
    if not any(data.values()):
        return []
    cols = list(dict.fromkeys(g.col for g in groups))
    rows = list(dict.fromkeys(g.row for g in groups))
    ncol = min(len(cols), 3)
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(
        nrow, ncol, figsize=(max(5, 1.4 * len(rows) + 2) * ncol, 3.8 * nrow), squeeze=False
    )
    rng = np.random.default_rng(0)  # the dots' horizontal jitter only
    for ax, c in zip(axes.flat, cols):
        present = [r for r in rows if data.get((r, c))]
        values = [data[(r, c)] for r in present]
        if values:
            ax.boxplot(values, showfliers=False)
            for i, v in enumerate(values, 1):
                ax.scatter(i + rng.uniform(-0.15, 0.15, len(v)), v, s=8, alpha=0.5)
                ax.scatter([i], [float(np.mean(v))], marker="^", color="black", zorder=3)
            ax.set_xticks(range(1, len(present) + 1))
            ax.set_xticklabels([f"{r}\n(n={len(v)})" for r, v in zip(present, values)], fontsize=8)
        ax.set_title(c or "all runs", fontsize=10)
        ax.set_ylabel("per-client accuracy (%)")
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(cols) :]:
        ax.set_visible(False)
    fig.tight_layout()
    _save_figure(fig, paths)
    return list(paths)
