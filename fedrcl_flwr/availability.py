"""Unreliable clients: dropout and stragglers under a simulated clock
(``federation.availability``; off by default).

The server samples a round's clients as always (``runtime.sample_partitions``: seed and
round only); this module then decides which of them do not report, before anything is
sent, so a dropped client costs no computation:

* **Dropout.** Client ``i`` has a dropout probability ``p_i``: ``dropout`` as a number
  (every client), a list (one per client), or drawn once per client from
  ``{distribution: uniform, low, high}`` / ``{distribution: beta, a, b}`` with
  ``default_rng([seed, DROPOUT_CLIENT_SALT])`` (one vector of ``num_clients`` draws).
  In round ``t`` a sampled client drops out iff ``u_{t,i} < p_i``, where
  ``u_t = default_rng([seed, t, DROPOUT_ROUND_SALT]).random(num_clients)``.
* **Stragglers** (``stragglers.speed`` set). Client ``i`` has a speed factor ``s_i``
  (a number, a list, ``{distribution: lognormal, sigma}`` = ``exp(sigma * z)``, median 1,
  or ``{distribution: uniform, low, high}``, drawn once per client with
  ``default_rng([seed, SPEED_SALT])``) and a workload ``w_i`` = its local steps per round
  (``local_epochs`` x steps per epoch of its training data, as ``training.train_local``
  runs them) over the mean of all clients' (1 for every client with
  ``client.iterations_per_epoch``). Its simulated round time in round ``t`` is
  ``w_i / s_i * exp(jitter * z_{t,i})`` with
  ``z_t = default_rng([seed, t, JITTER_SALT]).standard_normal(num_clients)``, in units of
  the round time of a nominal client (speed 1, mean workload). An available client whose
  time exceeds ``deadline`` is *late*: the server does not wait for it and it is dropped.
  ``sim_round_time`` is the time until the last reporting client (the deadline when a
  client was late). Without a deadline the clock is only recorded.

Every draw is a function of (seed, round, partition id) alone: identical for every method
and server optimizer, independent of which other clients were sampled, and a resumed run
drops exactly the clients an uninterrupted run drops (there is no state to checkpoint).

Per round ``metrics.jsonl`` carries ``dropped`` (sampled clients that did not report:
dropped out or late), ``dropped_ids``, ``dropped_total`` (since round 1) and, with
stragglers, ``late``, ``late_ids``, ``late_total`` and ``sim_round_time``. Clients that
raise or return unusable updates stay counted in ``failures``; a client dropped here
received the model (``model_bytes_down`` counts every sampled client) but uploads nothing.
``federation.round_timeout_s`` is unrelated: it is a real time-out on real devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

DROPOUT_CLIENT_SALT = 0xD20C
DROPOUT_ROUND_SALT = 0xD209
SPEED_SALT = 0x5BEED
JITTER_SALT = 0x5B17


def enabled(cfg) -> bool:
    av = cfg.federation.availability
    return _any_dropout(av.dropout) or av.stragglers.speed is not None


def _any_dropout(spec: Any) -> bool:
    if isinstance(spec, dict):
        return True
    if isinstance(spec, list):
        return any(float(v) > 0 for v in spec)
    return float(spec) > 0


def per_client_values(spec: Any, num_clients: int, seed: int, salt: int) -> np.ndarray:
    """One value per client from a number, a list or a distribution (see module doc)."""
    if isinstance(spec, list):
        return np.asarray(spec, dtype=np.float64)
    if not isinstance(spec, dict):
        return np.full(num_clients, float(spec))
    rng = np.random.default_rng([int(seed), salt])
    dist = spec["distribution"]
    if dist == "uniform":
        return rng.uniform(float(spec["low"]), float(spec["high"]), num_clients)
    if dist == "beta":
        return rng.beta(float(spec["a"]), float(spec["b"]), num_clients)
    if dist == "lognormal":
        return np.exp(float(spec["sigma"]) * rng.standard_normal(num_clients))
    raise ValueError(f"unknown distribution {dist!r}")


def local_steps(
    size: int,
    local_epochs: int,
    batch_size: int,
    iterations_per_epoch: int | None,
    last_batch: str = "keep",
) -> int:
    """Optimisation steps of one local round on ``size`` samples, as
    ``training.train_local`` runs them (``last_batch``: what becomes of an epoch's last,
    incomplete batch, :func:`fedrcl_flwr.training.last_batch_rule`)."""
    from fedrcl_flwr.training import batch_size_for, steps_per_epoch

    bs = batch_size_for(size, batch_size, iterations_per_epoch)
    return local_epochs * steps_per_epoch(size, bs, iterations_per_epoch, last_batch)


@dataclass
class RoundOutcome:
    """Which of a round's sampled clients report, and why the others do not."""

    reporting: list
    dropped_out: list = field(default_factory=list)
    late: list = field(default_factory=list)
    sim_round_time: float | None = None

    @property
    def dropped(self) -> list:
        return sorted(self.dropped_out + self.late)


class Availability:
    """The dropout / straggler simulation of one run (pure: no state across rounds)."""

    def __init__(
        self,
        *,
        seed: int,
        num_clients: int,
        clients_per_round: int,
        dropout: np.ndarray | None = None,
        speed: np.ndarray | None = None,
        workload: np.ndarray | None = None,
        deadline: float | None = None,
        jitter: float = 0.0,
    ):
        self.seed = int(seed)
        self.num_clients = int(num_clients)
        self.clients_per_round = int(clients_per_round)
        self.dropout = dropout
        self.speed = speed
        self.workload = workload if workload is not None else np.ones(num_clients)
        self.deadline = deadline
        self.jitter = float(jitter)
        self._counts: dict[int, tuple[int, int]] = {}  # round -> (dropped, late)

    @classmethod
    def from_config(
        cls, cfg, sizes: list | None = None, last_batch: str = "keep"
    ) -> Availability | None:
        """``None`` when availability is off. ``sizes``: each client's number of training
        samples (the workload of a straggler; default: equal workloads); ``last_batch``:
        the local epochs' rule for their last batch (:func:`local_steps`)."""
        if not enabled(cfg):
            return None
        fed, c = cfg.federation, cfg.client
        n = fed.num_clients
        av = fed.availability
        dropout = (
            per_client_values(av.dropout, n, cfg.seed, DROPOUT_CLIENT_SALT)
            if _any_dropout(av.dropout)
            else None
        )
        speed = workload = None
        if av.stragglers.speed is not None:
            speed = per_client_values(av.stragglers.speed, n, cfg.seed, SPEED_SALT)
            if sizes is not None:
                steps = np.array(
                    [
                        local_steps(
                            int(s), c.local_epochs, c.batch_size, c.iterations_per_epoch, last_batch
                        )
                        for s in sizes
                    ],
                    dtype=np.float64,
                )
                workload = steps / steps.mean() if steps.mean() > 0 else np.ones(n)
        return cls(
            seed=cfg.seed,
            num_clients=n,
            clients_per_round=fed.sampled_per_round(),
            dropout=dropout,
            speed=speed,
            workload=workload,
            deadline=av.stragglers.deadline,
            jitter=av.stragglers.jitter,
        )

    def times(self, rnd: int) -> np.ndarray | None:
        """Every client's simulated round time in round ``rnd`` (None: no stragglers)."""
        if self.speed is None:
            return None
        t = self.workload / self.speed
        if self.jitter:
            z = np.random.default_rng([self.seed, int(rnd), JITTER_SALT]).standard_normal(
                self.num_clients
            )
            t = t * np.exp(self.jitter * z)
        return t

    def round(self, rnd: int, sampled: list) -> RoundOutcome:
        """Split the round's sampled partition ids into reporting / dropped out / late."""
        sampled = [int(p) for p in sampled]
        out = RoundOutcome(reporting=[])
        available = sampled
        if self.dropout is not None:
            u = np.random.default_rng([self.seed, int(rnd), DROPOUT_ROUND_SALT]).random(
                self.num_clients
            )
            out.dropped_out = [p for p in sampled if u[p] < self.dropout[p]]
            available = [p for p in sampled if u[p] >= self.dropout[p]]
        times = self.times(rnd)
        if times is not None and self.deadline is not None:
            out.late = [p for p in available if times[p] > self.deadline]
            out.reporting = [p for p in available if times[p] <= self.deadline]
        else:
            out.reporting = list(available)
        if times is not None:
            done = [float(times[p]) for p in out.reporting]
            out.sim_round_time = self.deadline if out.late else (max(done) if done else 0.0)
        self._counts[int(rnd)] = (len(out.dropped), len(out.late))
        return out

    def totals(self, rnd: int) -> tuple[int, int]:
        """(dropped, late) summed over rounds 1..``rnd`` (rounds not seen in this process,
        e.g. before a resume, are recomputed from the seed)."""
        from fedrcl_flwr.run.runtime import sample_partitions

        dropped = late = 0
        for t in range(1, int(rnd) + 1):
            if t not in self._counts:
                self.round(
                    t, sample_partitions(self.seed, t, self.num_clients, self.clients_per_round)
                )
            d, lt = self._counts[t]
            dropped += d
            late += lt
        return dropped, late

    def record(self, rnd: int, outcome: RoundOutcome) -> dict:
        """The round's entries of ``metrics.jsonl``."""
        dropped_total, late_total = self.totals(rnd)
        rec = {
            "dropped": len(outcome.dropped),
            "dropped_ids": outcome.dropped,
            "dropped_total": dropped_total,
        }
        if self.speed is not None:
            rec.update(
                {
                    "late": len(outcome.late),
                    "late_ids": sorted(outcome.late),
                    "late_total": late_total,
                    "sim_round_time": outcome.sim_round_time,
                }
            )
        return rec
