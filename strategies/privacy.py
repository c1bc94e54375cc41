"""Central differential privacy for every server rule, built on Flower's own wrappers.

:class:`CentralDP` puts Flower's ``DifferentialPrivacyServerSideFixedClipping`` (``mode:
server``) or ``DifferentialPrivacyClientSideFixedClipping`` (``mode: client``; each client
clips with Flower's ``fixedclipping_mod``, installed by the ClientApp) around
:class:`AveragingStep`, a Flower ``Strategy`` that does nothing but the averaging step of
the owning :class:`~strategies.base.FederatedStrategy`. Per round:

1. ``configure_fit`` goes through the wrapper with the weights the clients are sent
   (``weights_to_send``: FedACG's look-ahead model), so Flower's server-side clipping
   takes updates relative to what each client started from; the client-side wrapper adds
   the clipping norm to every fit config (Flower's own entry, next to the
   ``FitInstructions`` of :mod:`fedrcl_flwr.protocol`, which pass it through untouched);
2. the owning strategy drops unusable results first (exceptions, NaN/Inf, wrong shapes,
   and in client mode an update longer than the clipping norm: a client whose ClientApp
   did not clip), then hands the kept ones to the wrapper's ``aggregate_fit``, which clips
   them (server mode), calls :meth:`AveragingStep.aggregate_fit` — the fixed-denominator
   average ``w_sent + Σ_kept (w_i − w_sent) / n``, n = the clients sampled per round (the
   plain mean when all report; under SecAgg+ the unmasked mean of the k reporting clients
   gives ``w_sent + (k/n)(mean − w_sent)``) — and adds Gaussian noise of std σ·C/n
   (Flower's ``add_gaussian_noise_to_params``);
3. the noised average goes to the strategy's ``server_update`` (FedAvg, FedAvgM, FedAdam,
   FedACG: post-processing of the private release).

Flower draws the noise from NumPy's global generator; it is reseeded from the operating
system before each release, so no seed in the experiment predicts it (runs with
``noise_multiplier > 0`` are therefore not bit-reproducible, and a resumed run draws
fresh noise). See ``fedrcl_flwr/privacy.py`` for the accounting and the refused
combinations.
"""

from __future__ import annotations

import numpy as np
from flwr.common import FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from fedrcl_flwr.app.wire.transport import is_reference, to_bytes
from fedrcl_flwr.privacy import PrivacyAccountant, noise_std


def _with_bytes(result):
    """A kept result's ``FitRes`` with its weights inside (Flower's wrappers decode the
    message's bytes; an upload by reference to the weight store is re-encoded)."""
    res = result.fit_res
    if not is_reference(res.parameters):
        return res
    return FitRes(res.status, to_bytes(result.weights), res.num_examples, res.metrics)


class AveragingStep(Strategy):
    """The strategy Flower's DP wrapper wraps: the fixed-denominator average of the
    (clipped) client models around the sent weights, nothing else."""

    def __init__(self, num_sampled: int):
        super().__init__()
        self.num_sampled = int(num_sampled)
        self.sent: list = []
        self.owner = None  # the FederatedStrategy whose configure step this runs
        self.wire: Parameters | None = None  # what the clients are sent (a store reference)
        self.secagg_active = 0  # > 0: results hold SecAgg+'s mean of that many clients

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        self.sent = [np.asarray(a) for a in parameters_to_ndarrays(parameters)]
        wire = self.wire if self.wire is not None else parameters
        return self.owner.sample_clients(server_round, wire, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        if not results:
            return None, {}
        sent = [a.astype(np.float64) for a in self.sent]
        total = [np.zeros_like(s) for s in sent]
        if self.secagg_active:  # one vector: the mean of the k active clients
            mean = parameters_to_ndarrays(results[0][1].parameters)
            for t, m, s in zip(total, mean, sent):
                t += self.secagg_active * (np.asarray(m, np.float64) - s)
        else:
            for _, res in results:
                for t, w, s in zip(total, parameters_to_ndarrays(res.parameters), sent):
                    t += np.asarray(w, np.float64) - s
        out = [
            (s + t / self.num_sampled).astype(ref.dtype)
            for s, t, ref in zip(sent, total, self.sent)
        ]
        return ndarrays_to_parameters(out), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class CentralDP:
    """``privacy.dp`` of one strategy: Flower's wrapper, the averaging step it wraps and
    the privacy accountant (``fedrcl_flwr.privacy``)."""

    def __init__(self, owner, dp_cfg, *, num_sampled: int, num_clients: int):
        self.mode = dp_cfg.mode
        self.clipping_norm = float(dp_cfg.clipping_norm)
        self.noise_multiplier = float(dp_cfg.noise_multiplier)
        self.step = AveragingStep(num_sampled)
        self.step.owner = owner
        wrapper = (
            DifferentialPrivacyServerSideFixedClipping
            if self.mode == "server"
            else DifferentialPrivacyClientSideFixedClipping
        )
        self.wrapper = wrapper(
            self.step,
            noise_multiplier=self.noise_multiplier,
            clipping_norm=self.clipping_norm,
            num_sampled_clients=int(num_sampled),
        )
        self.accountant = PrivacyAccountant(self.noise_multiplier, dp_cfg.delta, num_clients)
        self.std = noise_std(self.noise_multiplier, self.clipping_norm, num_sampled)

    def configure_fit(self, server_round: int, send: Parameters, client_manager, arrays=None):
        """Flower's wrapper reads the sent model from the bytes of a message: with the
        weight store (``send`` a reference) it gets ``arrays`` as bytes, and the clients
        still get the reference."""
        self.step.wire = None
        if is_reference(send):
            self.step.wire, send = send, to_bytes(arrays)
        return self.wrapper.configure_fit(server_round, send, client_manager)

    def unclipped(self, arrays) -> str | None:
        """Client mode: why an upload is refused (its update is longer than the clipping
        norm, i.e. its ClientApp did not clip), else ``None``. The margin covers float32
        rounding of the client's ``w_sent + clipped update``."""
        if self.mode != "client":
            return None
        sq = sum(
            float(np.sum((np.asarray(w, np.float64) - s.astype(np.float64)) ** 2))
            for w, s in zip(arrays, self.step.sent)
        )
        norm = float(np.sqrt(sq))
        if norm > self.clipping_norm * (1 + 1e-3) + 1e-6:
            return (
                f"update norm {norm:.4g} exceeds privacy.dp.clipping_norm "
                f"{self.clipping_norm:g}: the client did not clip (no fixedclipping_mod)"
            )
        return None

    def aggregate(self, server_round: int, kept: list, secagg_active: int = 0) -> list:
        """The noised average of the round's kept results (``strategies.screening.ClientResult``;
        Flower's wrapper gets their ``FitRes``: clipping in server mode, then
        :class:`AveragingStep`, then noise)."""
        self.step.secagg_active = int(secagg_active)
        np.random.seed()  # Flower's noise: from the OS, not from anything configured
        # Flower's DP wrappers read only the FitRes of each (proxy, FitRes) pair
        results = [(None, _with_bytes(r)) for r in kept]
        params, _ = self.wrapper.aggregate_fit(server_round, results, [])  # type: ignore[arg-type]
        if params is None:
            raise RuntimeError(f"round {server_round}: the DP wrapper aggregated no result")
        return parameters_to_ndarrays(params)


def privacy_settings(owner, privacy) -> tuple[bool, tuple[int, int] | None, CentralDP | None]:
    """``(secagg, secagg_params, dp)`` of a strategy (``owner``) from ``privacy`` (a
    ``fedrcl_flwr.config.PrivacyConfig`` or ``None``: off): SecAgg+ results (the
    ServerApp's workflow unmasks them) with ``(num_shares, threshold)``, and central DP
    through Flower's wrappers (:class:`CentralDP`) or ``None``."""
    secagg = bool(privacy is not None and privacy.secagg)
    params = (privacy.secagg_num_shares, privacy.secagg_threshold) if secagg else None
    dp = None
    if privacy is not None and privacy.dp is not None:
        dp = CentralDP(
            owner,
            privacy.dp,
            num_sampled=owner.clients_per_round,
            num_clients=owner.num_clients,
        )
    return secagg, params, dp
