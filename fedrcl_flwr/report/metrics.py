"""The reported metric of a run (``report --metric``), from ``summary.json`` or computed
from ``metrics.jsonl`` (:mod:`fedrcl_flwr.report.reading`).

Metrics: ``final`` (test accuracy of the last evaluated round), ``best`` (highest test
accuracy), ``last5`` (mean test accuracy of the last five evaluated rounds; FedCCL's "mean
of the last five rounds"), ``ema@R`` (the EMA accuracy of the last evaluated round <= R,
FedRCL's "accuracy at R rounds"; missing for a run that never reached round R). Per-client
evaluation (``evaluation.per_client``): ``client_mean``, ``client_std``,
``client_worst10``, ``client_best10`` (the ``client_acc_*`` of the last round that has
them). Without ``--metric`` (:func:`default_metric`): the runs' ``summary.json``
``report_metric``, else their reference's metric, else ``final``.

Inter-domain studies (``partition.scheme: domain``): FedCCL (Tables 1-2) and RethinkFL's
FPL report each domain's test accuracy and "Avg", their unweighted mean over domains.
``M_domain_mean`` is metric ``M`` per domain (``domain_accuracy`` of the round records),
averaged over the domains (:func:`fedrcl_flwr.run.summaries.per_domain_values`); when every
run is inter-domain, a pooled ``report_metric`` is reported as its domain mean (runs
written before the domain means have it computed from ``metrics.jsonl``).
"""

from __future__ import annotations

from fedrcl_flwr.config import check_reference
from fedrcl_flwr.config.catalog import (
    domain_metric,
    ema_round,
    is_domain_mean,
    is_inter_domain,
    is_report_metric,
    metric_choices,
)
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.report.reading import Records, Run, is_number
from fedrcl_flwr.run.run_files import CONFIG_FILE
from fedrcl_flwr.run.summaries import LAST_K, domains_of, per_domain_values, reported_value


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


def _ema_factor(run: Run) -> float:
    f = (run.config.get("evaluation") or {}).get("ema")
    return float(f) if isinstance(f, (int, float)) and is_number(f) else 0.9


def domain_values(run: Run, metric: str) -> dict:
    """Domain -> the run's value of the pooled metric under ``metric`` on that domain's
    test data: for ``last5`` the summary's ``last5_per_domain``, else computed from
    ``metrics.jsonl``'s ``domain_accuracy`` (:func:`fedrcl_flwr.run.summaries.
    per_domain_values`); ``{}`` when the run has none (or never reached ROUND of
    ``ema@ROUND``)."""
    target = ema_round(metric)
    if target is not None and _last_round(run) < target:
        return {}
    saved = domains_of(run.summary.get("last5_per_domain"))
    if saved and metric.startswith("last5"):  # the recorder's own, from the same records
        return saved
    return per_domain_values(_evaluated(run), metric, _ema_factor(run))


def metric_value(run: Run, metric: str) -> float | None:
    """The run's value of ``metric`` as a fraction in [0, 1], or None (missing)."""
    s = run.summary
    if is_domain_mean(metric):  # summary.json's, else computed from metrics.jsonl
        saved = reported_value(s, metric)
        if saved is not None and is_number(saved):
            return float(saved)
        per = domain_values(run, metric)
        return sum(per.values()) / len(per) if per else None
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
        if is_number(s.get(key)):
            return float(s[key])
        with_key = [r for r in run.records if is_number(r.get(key))]
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


def _all_inter_domain(runs: list[Run]) -> bool:
    return bool(runs) and all(
        is_inter_domain((r.config.get("partition") or {}).get("scheme")) for r in runs
    )


def default_metric(runs: list[Run]) -> str:
    """The runs' ``report_metric`` (summary.json), else their reference's, else final;
    when every run is inter-domain (``partition.scheme: domain``) a pooled
    ``report_metric`` (one a summary written before domain means holds) is taken as its
    domain mean, the papers' "Avg"."""
    inter = _all_inter_domain(runs)
    for run in runs:
        m = run.summary.get("report_metric")
        if is_report_metric(m, per_client=True):
            return domain_metric(str(m)) if inter else str(m)
    for run in runs:
        blocks = check_reference(run.config.get("reference"), str(run.path / CONFIG_FILE))
        if blocks:
            return blocks[0]["metric"]
    return domain_metric("final") if inter else "final"
