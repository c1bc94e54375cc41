"""The table's cells: runs grouped into rows and columns, the paper's numbers beside
them, and the paired comparison (``report --vs ROW``).

Runs whose configurations differ only by ``seed`` (and output / simulation resources /
name) form a group; a group's cell is the mean and the sample standard deviation
(``ddof = 1``; none for one run) over its runs, in percent, with ``n`` the number of runs
that have the metric (:mod:`fedrcl_flwr.report.metrics`).

Rows and columns (:func:`group_runs`): a row is the run's ``label`` (a sweep's variant
label), else its method (:func:`fedrcl_flwr.report.reading.method_label`). Columns are the
settings outside ``client`` / ``server`` that vary *within* a row (``alpha=0.05``);
whatever else differs between rows (a method's parameters, a model's projector, ...) is
named beside the method, readably: ``fedprox (mu=0.01)``, ``univarfl (projector=256)``; a
labelled row is named by its label and what it is follows the table (``rows: univarfl_proj
= univarfl (projector=256)``). The table's title names what every run shares (dataset,
partition and α, clients, rounds: :func:`setting_title`). When the runs carry the paper's
numbers (the experiment's ``reference`` blocks, see ``fedrcl_flwr.config.check_reference``)
for the reported metric, the paper's value and our difference (ours - paper) stand beside
ours (:func:`paper_value`).

Paired comparison (:func:`paired`): a seed fixes the partition and the clients sampled in
every round, identical for every method and strategy, so runs of two rows in one column
with the same seed form a pair. For each row and column: the per-seed differences (row −
ROW, points), their mean ± sample std, and a two-sided 95 % Student-t interval for the mean
difference (mean ± t_{0.975, n−1} · std / √n), beside the unpaired means ± std of both rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedrcl_flwr.config import check_reference, flatten_keys
from fedrcl_flwr.config.catalog import PARTITION_SCHEMES, dataset_info, is_domain_mean
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.report.metrics import check_metric, default_metric, domain_values, metric_value
from fedrcl_flwr.report.reading import Run, has_dp, is_number, load_runs, method_label

# config sections that do not change what a run computes (or that name it)
NOT_A_SETTING = ("seed", "name", "label", "output", "simulation", "reference")
CONFIDENCE = 0.95  # of the paired t-interval


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
    domains: list = field(default_factory=list)  # per run, domain -> value (domain means)
    curve: str = ""  # plots: the domain whose accuracy its curve is ("" = pooled)

    def domain_cell(self, name: str) -> Group:
        """The cell of domain ``name``: the same runs, their values on that domain."""
        return Group(self.key, self.runs, self.config, values=[d.get(name) for d in self.domains])

    def _seed_values(self) -> list:
        """``[(seed or None, [values])]`` in run order: the runs that have the metric, those
        with the same seed together (a run without a seed alone)."""
        out: list = []
        index: dict = {}
        for run, v in zip(self.runs, self.values):
            if v is None:
                continue
            seed = run.config.get("seed")
            if not is_number(seed):
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
        return any("dp_delta" in r.summary or has_dp(r.records) for r in self.runs)

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


def _setting(config: dict, summary: dict) -> dict:
    if not config:  # hand-made run dirs without a config: method and strategy only
        return {
            "client.method": summary.get("method"),
            "server.strategy": summary.get("strategy") or "fedavg",
        }
    return {k: v for k, v in config.items() if k not in NOT_A_SETTING}


def json_key(v: Any) -> str:
    """``v`` as canonical JSON: equal settings, equal keys."""
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
        key = json_key([label, setting])
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
    vary = [k for k in keys if len({json_key(g.flat.get(k)) for g in gs}) > 1]
    ident = {"client.method", "server.strategy"}

    def base(g: Group) -> str:
        return str(g.config.get("label") or method_label(g.config, g.runs[0].summary))

    def varies_within_a_row(k: str) -> bool:
        seen: dict = {}
        for g in gs:
            seen.setdefault(base(g), set()).add(json_key(g.flat.get(k)))
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
        split = [(k, v) for k, v in attrs if len({json_key(h.flat.get(k)) for h in same}) > 1]
        g.row = f"{label} ({_describe(split, names)})" if split else str(label)
    return gs


_VARIES = object()


def setting_title(groups: list[Group]) -> str:
    """What every run of the table shares, in words: dataset, partition (and α),
    clients per round, rounds — the settings that vary are the columns instead."""

    def common(key: str) -> Any:
        vals = {json_key(g.flat.get(key)) for g in groups}
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
        if scheme == "dirichlet" and is_number(alpha):
            text += f" α={alpha:g}"
        elif scheme == "domain" and balanced is False and is_number(alpha):
            text += f" (imbalanced, α={alpha:g})"
        elif scheme == "shards" and is_number(gamma):
            text += f" γ={gamma:g}"
        parts.append(text)
    clients = common("federation.num_clients")
    if is_number(clients):
        per, frac = common("federation.clients_per_round"), common("federation.participation")
        text = f"{clients} clients"
        if is_number(per):
            text += f", {per} per round"
        elif is_number(frac):
            text += f", {100 * frac:g} % per round"
        parts.append(text)
    rounds = common("federation.rounds")
    if is_number(rounds):
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
        elif json_key(node) != json_key(want):
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
        if is_domain_mean(metric):
            g.domains = [domain_values(r, metric) for r in g.runs]
    return groups, metric


def domain_names(groups: list[Group]) -> list[str]:
    """The domains of the groups' per-domain values, in the order the runs name them
    (the test set's order); empty for a pooled metric."""
    return list(dict.fromkeys(k for g in groups for d in g.domains for k in d))


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
    rows, cols = layout(groups)[:2]
    groups = sorted(groups, key=lambda g: (rows.index(g.row), cols.index(g.col)))
    out = []
    for g in groups:
        ref = refs.get(g.col)
        if g.row == ref_row or ref is None:
            continue
        mine, theirs = g.by_seed, ref.by_seed
        out.append(Paired(g, ref, {s: mine[s] - theirs[s] for s in sorted(mine) if s in theirs}))
    return out


def layout(groups: list[Group]):
    """Rows, columns, the cell of (row, column), the best mean per column and the
    columns that have a paper's number."""
    rows = list(dict.fromkeys(g.row for g in groups))
    cols = list(dict.fromkeys(g.col for g in groups))
    cell = {(g.row, g.col): g for g in groups}
    best = {}
    for c in cols:
        means = [g.mean for g in groups if g.col == c and g.mean is not None]
        best[c] = max(means) if means else None
    with_paper = {c for c in cols if any(g.paper is not None for g in groups if g.col == c)}
    return rows, cols, cell, best, with_paper


def domain_heading(col: str, name: str) -> str:
    """A column's heading in a per-domain table: ``setting: name`` (``name`` alone
    without a setting)."""
    return f"{col}: {name}" if col else name
