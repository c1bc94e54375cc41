"""Reading finished runs for ``fedrcl-flwr report`` and ``fedrcl-flwr plot``.

The run directories are each DIR itself or every run below it (a sweep's ``--out``,
:func:`find_runs`). A run is read from its ``config.yaml`` (the resolved experiment),
``summary.json`` and ``metrics.jsonl`` (the source of truth: every metric missing from the
summary is computed from it, :mod:`fedrcl_flwr.report.metrics`). Every file is checked as
it is read: a damaged one is one :class:`~fedrcl_flwr.errors.ConfigError` naming the file
(and ``file:line``); the torn last line of a run killed while writing it is left out with a
warning. :func:`method_label` names a run by its method (``client.method``, prefixed by the
server optimizer when it is not ``fedavg``: ``fedacg+fedrcl``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrcl_flwr.config import check_reference
from fedrcl_flwr.errors import ConfigError, shown
from fedrcl_flwr.run.run_files import CONFIG_FILE, METRICS_FILE, NOT_RUN_DIRS, SUMMARY_FILE

SKIP_DIRS = NOT_RUN_DIRS


@dataclass
class Run:
    """A run directory as read: its config, summary and round records."""

    path: Path
    config: dict
    summary: dict
    records: Sequence  # a list, or the lazily parsed Records of a metrics.jsonl

    @property
    def method(self) -> str:
        return method_label(self.config, self.summary)


def method_label(config: dict, summary: dict | None = None) -> str:
    """The run's method as a row names it: ``client.method``, prefixed by
    ``server.strategy`` when that is not ``fedavg`` (``fedacg+fedrcl``); from
    ``summary.json`` for a run without a config."""
    summary = summary or {}
    method = (config.get("client") or {}).get("method") or summary.get("method") or "?"
    strategy = (config.get("server") or {}).get("strategy") or summary.get("strategy") or "fedavg"
    return str(method) if strategy == "fedavg" else f"{strategy}+{method}"


def is_number(v: Any) -> bool:
    """A JSON number (``true`` / ``false`` are not)."""
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
    if not is_number(v):
        return "must be a number or null"
    # compared as they are: an integer of 400 digits is no float (math.isfinite overflows)
    if isinstance(v, float) and not math.isfinite(v) or not 0 <= v <= 1:
        return "must be a fraction in [0, 1] (or null)"
    return None


MAX_ROUND = 2**63 - 1  # a round number a run can write (a larger one is a damaged file)


def _round_problem(v: Any) -> str | None:
    if not is_number(v) or (isinstance(v, float) and not math.isfinite(v)):
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


def has_dp(records: Sequence) -> bool:
    """A record carries ``dp_delta`` (the run ran with ``privacy.dp``)."""
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
