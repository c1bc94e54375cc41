"""FedCCL (Qiao et al., 2024, "Federated Learning with Dual Clustered Feature Contrast").

Local objective (Eq. 18): L = CE + w_local·L_local + w_global·L_global on the penultimate
feature ξ = f(x):

* L_local  (Eq. 16): each sample against *all* local cluster signals the server relayed
  (from every client banked in the last ``server.signals.max_age`` rounds): positives are
  the signals of its class, −log(Σ_pos e^{cos/τ} / Σ_all e^{cos/τ});
* L_global (Eq. 17): the same against one global signal per class (server: FINCH over the
  banked signals of a class, Eq. 14, averaged, Eq. 15).

Samples whose class has no signal are left out of the mean (see
``fedrcl_flwr.losses.fedccl``). Round one has no signals: CE alone (no zero terms).

After training the client embeds its training data with the updated model (eval mode),
runs FINCH per class and uploads the cluster means with their class labels and sizes
(Eqs. 8-10). Which FINCH level: ``signal_level`` — ``coarsest`` by default: the finest
partition (first neighbours) yields ~N/3 clusters, i.e. near-per-sample signals that cost
bandwidth and carry noise, while the coarsest kept level is the most compact grouping
FINCH still considers meaningful (it drops single-cluster levels), matching the paper's
"repeat until the number of clusters no longer changes".

The other choices the paper leaves open, each a parameter (docs/research.md, "FedCCL: the
paper's open choices, tested", has the ablation):

* ``finch_early_exit`` (``true``): FINCH's ``ensure_early_exit`` on the client. The
  paper's recursion (Sec. 4.1) has no threshold; the reference FINCH prunes links longer
  than the first level's, which stops the hierarchy earlier (more, finer clusters at
  ``coarsest``). ``false`` is the recursion as the paper words it (and as FPL's server
  runs FINCH).
* ``feature`` (``penultimate``): which layer is ξ = f(x) (Eq. 6). The paper's inter-domain
  model is a ViT-Tiny "feature extractor" followed by a 192 -> 128 -> C MLP of "decision-
  making layers"; read literally, f(x) is the MLP's input (cnn5: ``fc1``), while FPL's
  code contrasts the input of the last linear layer (``penultimate``).
* ``reduction`` (``mean``): Eqs. (16)-(17) sum over the client's samples, Eq. (2) averages
  the CE, and Eq. (18) adds them with weight 1. ``mean`` averages each contrast over the
  batch's samples that have a positive (all three terms on one scale); ``sum`` keeps the
  printed sums (per batch), so each contrast weighs ~B times the CE.
* ``tau`` (0.07, Sec. 5.1: "the temperature to 0.07 for all experiments"; Eqs. 16-17 print
  exp(sim) without it), ``w_local`` / ``w_global`` (1, 1: Eq. 18).

Ablations (Tables 5-7): ``use_local`` / ``use_global`` switch the terms; ``local_signal:
mean`` uploads class-mean prototypes instead of clusters; ``global_signal: mean`` makes
the server average signals instead of clustering them — a plain average over the banked
signals of a class, Eq. 12 (``server.signals.mean_weighting: samples`` weights by counts).

FedCCL+ (Appendix A): ``adversarial: true`` trains on PGD examples (ε, step, steps) with
CE and both contrast terms on the adversarial features (Eqs. 21-24). ε and step are in
[0, 1] pixel units (8/255, 2/255), adversarial pixels are clamped to [0, 1] and the data's
normalisation is applied inside the attacked model (``losses.fedccl.PixelSpace``).
"""

from __future__ import annotations

from clients.base import SignalClient
from fedrcl_flwr.components import (
    at_least,
    feature_tap,
    finch_level,
    non_negative,
    one_of,
    positive,
)
from fedrcl_flwr.signals import class_cluster_signals
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FedCCLClient(SignalClient):
    method = "fedccl"
    defaults = {
        "tau": 0.07,
        "w_local": 1.0,
        "w_global": 1.0,
        "use_local": True,
        "use_global": True,
        "local_signal": "cluster",
        "global_signal": "cluster",
        "signal_level": "coarsest",
        "feature": "penultimate",
        "finch_early_exit": True,
        "reduction": "mean",
        "adversarial": False,
        "eps": 8 / 255,
        "step": 2 / 255,
        "steps": 10,
        "embed_batch": 500,
    }
    rules = {
        "tau": positive(),
        "w_local": non_negative(),
        "w_global": non_negative(),
        "local_signal": one_of("cluster", "mean"),
        "global_signal": one_of("cluster", "mean"),
        "signal_level": finch_level(),
        "feature": feature_tap(),
        "reduction": one_of("mean", "sum"),
        "eps": positive(),
        "step": positive(),
        "steps": at_least(1),
        "embed_batch": at_least(1),
    }

    @classmethod
    def exchange_settings(cls, p: dict) -> dict:
        out = {
            "global_mode": "mean" if p["global_signal"] == "mean" else "finch_mean",
            "send_local": bool(p["use_local"]),
        }
        if p["global_signal"] == "mean":  # Table 7 ablation: Eq. 12's plain average
            out["mean_weighting"] = "uniform"
        return out

    def on_round_start(self, ins):
        self.local_signals = self.load_signals(ins.signals_local) if self.p["use_local"] else None
        self.global_signals = (
            self.load_signals(ins.signals_global) if self.p["use_global"] else None
        )

    def loss_terms(self):
        from fedrcl_flwr.losses.fedccl import global_cluster_contrast, local_cluster_contrast

        terms = [cross_entropy_term()]
        tau, feat = float(self.p["tau"]), self.p["feature"]
        red = str(self.p["reduction"])
        if self.local_signals is not None:
            sv, sl = self.local_signals
            terms.append(
                LossTerm(
                    "local",
                    lambda b: local_cluster_contrast(
                        b.feats[feat], b.y, sv, sl, tau=tau, reduction=red
                    ),
                    weight=float(self.p["w_local"]),
                    needs_features=True,
                )
            )
        if self.global_signals is not None:
            gv, gl = self.global_signals
            terms.append(
                LossTerm(
                    "global",
                    lambda b: global_cluster_contrast(
                        b.feats[feat], b.y, gv, gl, tau=tau, reduction=red
                    ),
                    weight=float(self.p["w_global"]),
                    needs_features=True,
                )
            )
        return terms

    def batch_transform(self):
        if not self.p["adversarial"]:
            return None
        from fedrcl_flwr.losses.fedccl import dataset_pixel_stats, pgd_attack

        p = self.p
        mean, std = dataset_pixel_stats(self.data.dataset)  # eps/step in [0, 1] pixels
        # on the device once per round (a per-step host copy would wait for the device)
        mean, std = mean.to(self.device), std.to(self.device)

        def adversarial(x, y, model):
            x_adv = pgd_attack(
                model,
                x,
                y,
                eps=float(p["eps"]),
                step=float(p["step"]),
                steps=int(p["steps"]),
                mean=mean,
                std=std,
            )
            return x_adv.detach(), y, {}

        return adversarial

    def on_round_end(self, report):
        feats, labels = self.embed_local_data()
        level = self.p["signal_level"]
        s = class_cluster_signals(
            feats,
            labels,
            mode=self.p["local_signal"],
            level=int(level) if level.isdigit() else level,
            early_exit=bool(self.p["finch_early_exit"]),
        )
        self.upload_signals(report, s)
        used = report.method_metrics
        used["used_local_signals"] = (
            0 if self.local_signals is None else int(self.local_signals[0].shape[0])
        )
        used["used_global_signals"] = (
            0 if self.global_signals is None else int(self.global_signals[0].shape[0])
        )
