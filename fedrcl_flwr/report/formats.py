"""The report's table in Markdown, CSV or LaTeX (``fedrcl-flwr report --format``), and
:func:`report`, the command's whole table.

The cells, rows, columns and paired comparison are :mod:`fedrcl_flwr.report.grouping`'s;
here they are laid out: the best mean per column is marked, the paper's value and our
difference stand beside ours where the runs carry them. A domain-mean table (an
inter-domain study, :mod:`fedrcl_flwr.report.metrics`) has a column per domain, then
``Avg (METRIC)``, the column that carries n, the paper's number and the paired
comparison, as FedCCL's Tables 1-2 and RethinkFL's tables lay them out.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from typing import Any

from fedrcl_flwr.config.catalog import is_domain_mean
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.report.grouping import (
    CONFIDENCE,
    Group,
    Paired,
    build_table,
    domain_heading,
    domain_names,
    find_row,
    layout,
    paired,
    setting_title,
)


def _best_per_domain(groups: list[Group]) -> dict:
    """(column, domain) -> the best mean of the column's rows on that domain."""
    best: dict = {}
    for g in groups:
        for d in domain_names([g]):
            m = g.domain_cell(d).mean
            if m is not None and (best.get((g.col, d)) is None or m > best[(g.col, d)]):
                best[(g.col, d)] = m
    return best


def _avg_heading(metric: str) -> str:
    return f"Avg ({metric})"


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
            f"| {_md(p.group.row)} | {_md(p.group.col) or '—'} | {per} | {mean} | "
            f"{_ci_text(p)} | {p.n} | {_unpaired_text(p)} |"
        )
    lines += [
        "",
        f"CI: two-sided {level} Student-t interval of the mean paired difference, "
        "mean ± t(n−1) · std / √n (none for n < 2); std: sample std (n − 1).",
    ]
    return "\n".join(lines)


def _domain_text(g: Group | None, name: str, best: dict, bold: tuple[str, str], pm: str) -> str:
    """A per-domain cell: mean ± std over seeds (%), the column's best in ``bold``."""
    if g is None:
        return ""
    d = g.domain_cell(name)
    if d.mean is None:
        return "missing"
    text = _pct(d.mean) + (f" {pm} {_pct(d.std)}" if d.std is not None else "")
    b = best.get((g.col, name))
    return f"{bold[0]}{text}{bold[1]}" if b is not None and math.isclose(d.mean, b) else text


def format_markdown(groups: list[Group], metric: str) -> str:
    """Rows by columns; for a domain-mean metric each column is its domains then Avg
    (the domain mean), as FedCCL's Tables 1-2 and RethinkFL's tables lay them out."""
    rows, cols, cell, best, with_paper = layout(groups)
    names, best_d = domain_names(groups), _best_per_domain(groups)
    header = ["method"]
    for c in cols:
        header += [_md(domain_heading(c, d)) for d in names]
        name = _md(domain_heading(c, _avg_heading(metric)) if names else c or metric)
        header.append(name)
        if c in with_paper:
            header += [f"{name} paper", f"{name} diff"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [_md(r)]
        for c in cols:
            g = cell.get((r, c))
            cells += [_domain_text(g, d, best_d, ("**", "**"), "±") for d in names]
            cells.append(_ours(g, best[c], ("**", "**"), "±"))
            if c in with_paper:
                cells += [_pct(g.paper) if g else "", _pct(g.diff, True) if g else ""]
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        f"\nmetric: {metric}; mean ± sample std over seeds (%), n distinct seeds; best per "
        "column in bold"
    )
    if names:
        note += (
            "; per domain: that domain's test accuracy; Avg: their unweighted mean over "
            "domains (the papers' Avg)"
        )
    if is_domain_mean(metric) and any(g.missing for g in groups):
        note += "; missing: runs without per-domain test accuracy (metrics.jsonl domain_accuracy)"
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
    _, cols, _, best, _ = layout(groups)
    by_group = {id(p.group): p for p in pairs or []}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    private = any(g.private for g in groups)  # privacy.dp: one more column, dp_epsilon
    names = domain_names(groups)  # a domain-mean metric: each domain's mean and std too
    head = [
        "method",
        "setting",
        "metric",
        "n",
        "missing",
        "mean",
        "std",
        *[x for d in names for x in (d, f"{d}_std")],
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
            *[_pct(x) for d in names for x in (g.domain_cell(d).mean, g.domain_cell(d).std)],
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
    rows, cols, cell, best, with_paper = layout(groups)
    names, best_d = domain_names(groups), _best_per_domain(groups)
    spec = "l" + "".join("r" * len(names) + ("rrr" if c in with_paper else "r") for c in cols)
    head = ["Method"]
    for c in cols:
        head += [_tex(domain_heading(c, d)) for d in names]
        head.append(_tex(domain_heading(c, _avg_heading(metric)) if names else c or metric))
        if c in with_paper:
            head += ["Paper", r"$\Delta$"]
    out = [r"\begin{tabular}{" + spec + "}", r"\toprule", " & ".join(head) + r" \\", r"\midrule"]
    for r in rows:
        cells = [_tex(r)]
        for c in cols:
            g = cell.get((r, c))
            for d in names:
                text = _domain_text(g, d, best_d, (r"\mathbf{", "}"), r"\pm")
                cells.append(f"${text}$" if text not in ("", "missing") else text or "--")
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
            f"{_tex(p.group.row)} & {_tex(p.group.col) or '--'} & ${mean}$ & "
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
    vs: str | Sequence[str] | None = None,
    notes: list | None = None,
) -> str:
    """The table of ``dirs`` in ``fmt``; with ``vs`` (one row or several) also the paired
    comparison with each, in turn. A note that is not part of a csv / latex table
    (``--vs`` with one row) goes to ``notes``."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    groups, metric = build_table(dirs, metric)
    baselines = [vs] if isinstance(vs, str) else list(dict.fromkeys(vs or []))
    if not baselines:
        return FORMATS[fmt](groups, metric)
    refs = [find_row(groups, b) for b in baselines]  # every --vs checked before output
    if len({g.row for g in groups}) < 2:
        line = f"--vs {baselines[0]}: nothing to compare: the table has one row ({refs[0]})"
        if fmt == "markdown":
            return format_markdown(groups, metric) + "\n\n" + line
        if notes is not None:
            notes.append(line)
        return FORMATS[fmt](groups, metric)
    refs = list(dict.fromkeys(refs))
    pairs = {ref: paired(groups, ref) for ref in refs}
    if fmt == "csv":
        head, *_ = format_csv(groups, metric, [], refs[0]).splitlines()
        body = [
            line
            for ref in refs
            for line in format_csv(groups, metric, pairs[ref], ref).splitlines()[1:]
        ]
        return "\n".join([head, *body]) + "\n"
    if fmt == "latex":
        return format_latex(groups, metric) + "".join(
            "\n" + format_paired_latex(pairs[ref], ref, metric) for ref in refs
        )
    return format_markdown(groups, metric) + "".join(
        "\n\n" + format_paired_markdown(pairs[ref], ref, metric) for ref in refs
    )
