"""What ``summary.json`` holds beyond the round records' last values, computed from them:
the per-domain values and the papers' "Avg" (the unweighted mean over domains;
``last5`` is FedCCL's mean of the last five communication rounds, ``ema@ROUND`` FedRCL's
EMA accuracy), the per-client and unreliable-client entries, the value of a report
metric (:func:`reported_value`), and the clients that failed in every round
(:func:`always_failing`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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
