"""The end of a round on the server: evaluate the round's global model, record it, hand
the round's state to the checkpoint (:func:`finish_round`), either in line or in one
background thread while the next round trains (:class:`BackgroundRoundEnd`, the
simulation's ``overlap_evaluation``).

The background thread works on a snapshot of the round's weights, fit info and state; at
most one round end is in flight and the next one waits for it, so records, checkpoints
and results are exactly those of the sequential order (:mod:`strategies.base`, module
doc). No Flower here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from fedrcl_flwr.run import timers
from strategies.round_records import AllClientsFailed


@dataclass(frozen=True)
class RoundEndHooks:
    """What a round end calls: the centralised evaluation (``None``: none), the run's
    recorder and checkpoint, and the message of a run that never trained
    (:meth:`strategies.round_records.RoundLedger.never_trained`, read when the last round
    ends)."""

    rounds: int
    evaluate_fn: Callable[[int, list], tuple[float, dict]] | None
    on_record: Callable[[dict], None] | None
    on_checkpoint: Callable[[int, dict], None] | None
    never_trained: Callable[[int, dict], str]


def finish_round(
    hooks: RoundEndHooks,
    rnd: int,
    due: bool,
    state: dict,
    fit_info: dict,
    round_start: float,
    handed_over: float | None = None,
) -> dict | None:
    """Evaluate the round's global model (``state["weights"]``) when ``due``, record it,
    then hand the round's state to ``on_checkpoint``; a failed round is recorded even
    when not evaluated, and a run whose last round ends with no round trained raises
    :class:`AllClientsFailed`. ``round_time_s``: seconds from the round's start to its
    record, evaluation included; for a round whose evaluation overlaps the next round
    (``handed_over``: when it was handed to the background thread) to the hand-over, so
    that the rounds' times add up to the run's time instead of counting the overlapped
    evaluation twice."""
    record = None
    timers.server_event("round_end_start", round=rnd)
    if due and hooks.evaluate_fn is not None:  # due only with an evaluate_fn
        loss, metrics = hooks.evaluate_fn(rnd, state["weights"])
        record = {
            "round": rnd,
            "test_loss": loss,
            **metrics,
            **fit_info,
            "round_time_s": (handed_over or time.time()) - round_start,
        }
    elif fit_info.get("round_failed"):  # recorded even when not evaluated
        ended = handed_over or time.time()
        record = {"round": rnd, **fit_info, "round_time_s": ended - round_start}
    if record is not None and hooks.on_record is not None:
        hooks.on_record(record)
    if rnd >= hooks.rounds and not state.get("rounds_trained"):
        raise AllClientsFailed(hooks.never_trained(rnd, fit_info))
    if hooks.on_checkpoint is not None:
        hooks.on_checkpoint(rnd, state)
    timers.server_event("round_end_end", round=rnd)
    return record


class RoundEnds:
    """A strategy's round ends: in line, or with ``overlap`` (before the last round) in
    one background thread created on first use, one in flight; and the round end that
    waits for the round's per-client evaluation (:attr:`deferred`)."""

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        self.deferred: tuple | None = None  # a round end awaiting per-client evaluation
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def run(self, hooks: RoundEndHooks, job: tuple) -> dict | None:
        """Run :func:`finish_round` on ``job`` (``rnd, due, state, fit_info,
        round_start``) now, or in the background thread (then ``None``: the run's record
        comes from the thread). The round's time ends at the hand-over: its evaluation
        overlaps the next round, whose own time already counts those seconds."""
        rnd, due, state, fit_info, round_start = job
        if not self.overlap or rnd >= hooks.rounds:
            return finish_round(hooks, rnd, due, state, fit_info, round_start)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="fedrcl-round-end")
        handed_over = time.time()
        self._pending = self._executor.submit(
            finish_round, hooks, rnd, due, state, fit_info, round_start, handed_over
        )
        return None

    def drain(self, hooks: RoundEndHooks) -> None:
        """Wait for the round end in flight, if any (re-raising its error); a round end
        still waiting for a per-client evaluation that never came is done without it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            finish_round(hooks, *deferred)
