"""The progress lines a run prints, one per round: what they show (:func:`format_round_line`;
the EMA accuracy only for a run that reports it, :func:`shows_ema`), and the time left
(:func:`round_eta`, :func:`format_duration`)."""

from __future__ import annotations


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
