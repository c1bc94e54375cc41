"""FedProc (Mu et al., Future Generation Computer Systems 2023, "FedProc: Prototypical
Contrastive Federated Learning on Non-IID Data"; compared by FedCCL).

Local objective, a convex combination moving from contrast to classification:

    L = α_t·L_GPCL + (1 − α_t)·CE,   α_t = 1 − (t − 1)/(T − 1)   (t = 1..T rounds)
    L_GPCL = −log( e^{cos(z, C̄_y)/τ} / Σ_c e^{cos(z, C̄_c)/τ} )

against the global class prototypes C̄ (loss terms ``proc`` and ``ce``;
:func:`fedrcl_flwr.losses.baselines.fedproc_loss`). The schedule is the reference code's
(``alpha = 1 - epoch_index / (communication_epoch - 1)``, the code base FPL and FedCCL
compare with). Before any global prototype exists (round one) the contrast term is absent
and the objective is plain CE — the reference code would compute ``1·(0·CE) + 0·CE`` and
not learn at all in round one. A weight of zero skips a term (last round: CE only).

Prototypes: class means of the penultimate feature uploaded after training; the server's
SignalExchange averages them per class (``global_mode: mean``, ``send_local: false``,
``max_age: 1``) — see :mod:`clients.fedproto`.

Parameters: ``tau`` (τ) = 0.07 — FedCCL Sec. 5.1 sets the temperature to 0.07 "for all
experiments" (the reference code has none, i.e. τ = 1); ``alpha`` = −1 (the schedule
above; a value in [0, 1] fixes α); ``feature`` = ``penultimate``; ``embed_batch`` = 500.
"""

from __future__ import annotations

from clients.fedproto import PrototypeClient
from fedrcl_flwr.components import at_least, between, feature_tap, positive
from fedrcl_flwr.training import LossTerm, cross_entropy_term


def fedproc_alpha(server_round: int, rounds: int) -> float:
    """α_t = 1 − (t − 1)/(T − 1), clipped to [0, 1] (0 when T = 1)."""
    if rounds <= 1:
        return 0.0
    return min(1.0, max(0.0, 1.0 - (server_round - 1) / (rounds - 1)))


class FedProcClient(PrototypeClient):
    method = "fedproc"
    defaults = {"tau": 0.07, "alpha": -1.0, "feature": "penultimate", "embed_batch": 500}
    rules = {
        "tau": positive(),
        "alpha": between(0.0, 1.0, also=(-1.0,)),
        "feature": feature_tap(),
        "embed_batch": at_least(1),
    }

    def alpha(self) -> float:
        a = float(self.p["alpha"])
        if a < 0:
            return fedproc_alpha(self.run_round, self.cfg.federation.rounds)
        return a

    def loss_terms(self):
        alpha = self.alpha()
        if self.global_protos is None:
            return [cross_entropy_term()]
        from fedrcl_flwr.losses.baselines import fedproc_loss

        pv, pl = self.global_protos
        feat, tau = self.p["feature"], float(self.p["tau"])
        return [
            cross_entropy_term(1.0 - alpha),
            LossTerm(
                "proc",
                lambda b: fedproc_loss(b.feats[feat], b.y, pv, pl, tau),
                weight=alpha,
                needs_features=True,
            ),
        ]

    def on_round_end(self, report):
        report.method_metrics["fedproc_alpha"] = self.alpha()
        super().on_round_end(report)
