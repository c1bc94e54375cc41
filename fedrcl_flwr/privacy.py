"""Privacy of the client updates (``privacy`` section): which combinations are sound, and
the privacy accountant. No Flower here: the mechanisms are Flower's own, composed in
``strategies/privacy.py`` (central DP: ``DifferentialPrivacyServerSideFixedClipping`` /
``DifferentialPrivacyClientSideFixedClipping`` + ``fixedclipping_mod``) and
``fedrcl_flwr/app/`` (SecAgg+: ``secaggplus_mod`` + ``SecAggPlusWorkflow``).

**Central DP** (``privacy.dp: {mode, noise_multiplier σ, clipping_norm C, delta δ}``). Each
round the kept client updates Δ_i = w_i − w_sent (w_sent: what the clients received, the
look-ahead model for FedACG) are clipped to norm C (Flower's ``compute_clip_model_update``,
on the server or, ``mode: client``, by each client's ``fixedclipping_mod``), averaged with
a *fixed* denominator n = ``federation.clients_per_round`` (DP-FedAvg's fixed-denominator
estimator, McMahan et al. 2018: ``w_sent + Σ_kept clip(Δ_i) / n``, the plain mean when
every sampled client reports), and Flower's wrapper adds N(0, (σC/n)²) to every entry.
The server optimizer (FedAvgM, FedAdam, FedACG) then acts on that noised average: post-
processing, so the guarantee holds for every strategy that only uses the average.

**Accounting** (``dp_epsilon`` per evaluated round in ``metrics.jsonl``, the final value
in ``summary.json``, ``report`` beside each cell). Google's ``dp-accounting`` RDP
accountant (``dp_accounting.rdp.RdpAccountant``), the backend Flower itself builds its
accountant on (``flwr.serverapp.RdpAccountant``, ``flwr[dp]``), chosen over Opacus'
accountant because it is the accountant alone (no DP-SGD machinery), covers every
sampling model (Poisson, without replacement, none) and neighbouring relation, and is
the one Flower's own DP strategies are checked against. The model, as Flower's accountant
for fixed clipping: client-level DP under add/remove-one (a client's clipped update
present or absent: sensitivity C of the sum, σ the noise multiplier), *no amplification
by subsampling*. Amplification would need the sampled set to be secret; here it is a
public function of ``seed`` and round (``runtime.sample_partitions``), so a client's data
enters only the releases of the rounds it is sampled in, and each such release is one
Gaussian mechanism. ε after round t is therefore that of the composition of k Gaussian
mechanisms with k = the largest number of released rounds any client was sampled in
(``dp_max_client_rounds``; = t under full participation) — RDP α·k/(2σ²), converted to
(ε, δ) by dp-accounting (Canonne, Kamath & Steinke 2020, Prop. 12). σ = 0 gives ε = ∞
(written ``null``). Not covered (as in Flower): the fit metrics clients report in the
clear (training losses, ``local_repr_*``), which feed ``metrics.jsonl``.

**SecAgg+** (``privacy.secagg: true``): the server learns only the (weighted) sum of the
masked, quantised uploads. Methods whose server needs each client's upload are refused
(see :func:`check_privacy`), and so are combinations Flower's mechanisms cannot make
correct.
"""

from __future__ import annotations

import numpy as np

MAX_SECAGG_STEP = 1e-3  # SecAgg+ quantisation step 2·range/levels at most this


def integer_entries(model) -> list[str]:
    """Names of the model's state entries that are not floating point (BatchNorm's
    ``num_batches_tracked``)."""
    import torch

    return [k for k, v in model.state_dict().items() if not torch.is_floating_point(v)]


def check_privacy(cfg, method_cls, exchange: dict | None, get_model) -> None:
    """Combinations of ``privacy`` with the method, strategy, model and federation that
    cannot be made correct (a ``ConfigError`` with the reason, one line). Called by
    ``fedrcl_flwr.app.validate`` with the method's class and signal-exchange settings."""
    from fedrcl_flwr.errors import ConfigError

    dp, secagg = cfg.privacy.dp, cfg.privacy.secagg
    if dp is None and not secagg:
        return
    what = "privacy.dp" if dp is not None else "privacy.secagg"
    if exchange is not None:
        why = (
            "its clients upload feature signals (prototypes / cluster signals) besides "
            "the model, which the server needs one by one (FedCCL clusters them with "
            "FINCH, FedProto/FedProc/FPL/FedPCL build per-class prototypes) and which "
            "travel in the fit metrics"
        )
        if dp is not None:
            raise ConfigError(
                f"'{what}' cannot protect method '{method_cls.method}': {why}, "
                "outside Flower's clipping and noise"
            )
        raise ConfigError(
            f"'privacy.secagg' cannot be used with method "
            f"'{method_cls.method}': {why}, outside SecAgg+'s masked sum"
        )
    model = get_model()
    ints = integer_entries(model) if model is not None else []
    if ints:
        raise ConfigError(
            f"'{what}' needs a model whose state is all floating point; model.name="
            f"{cfg.model.name} has integer buffers ({ints[0]}, ...: BatchNorm step counters) "
            "that Flower's clipping cannot scale and SecAgg+ cannot sum; use a "
            "GroupNorm / norm-free model (cnn5, resnet18_gn, vgg9_gn, ...)"
        )
    if secagg and model is not None:
        check_secagg_range(cfg, model)
    if dp is not None:
        _check_dp(cfg, method_cls, dp, secagg)
    if secagg and cfg.federation.sampled_per_round() < 2:
        raise ConfigError(
            "'privacy.secagg' needs at least 2 clients per round (SecAgg+ "
            "masks each upload with its neighbours'; got "
            f"{cfg.federation.sampled_per_round()})"
        )


def _check_dp(cfg, method_cls, dp, secagg: bool) -> None:
    """:func:`check_privacy`'s rules for ``privacy.dp``: not with FedDyn, a uniform
    weighting, and with SecAgg+ clipping on the clients."""
    from fedrcl_flwr.errors import ConfigError

    if cfg.server.strategy == "feddyn" or method_cls.method == "feddyn":
        raise ConfigError(
            "'privacy.dp' cannot be combined with FedDyn: FedDyn's server state h must "
            "track the clients' own correction terms ∇L_k, which each client updates "
            "from its unclipped, noise-free model (Acar et al. 2021, Alg. 1); clipping "
            "and noising the uploads breaks that identity"
        )
    if cfg.server.weighting != "uniform":
        raise ConfigError(
            "'privacy.dp' needs server.weighting: uniform: Flower's noise std σ·C/n "
            "covers an equally weighted average of n clipped updates; a sample-weighted "
            f"one has a larger sensitivity (got server.weighting={cfg.server.weighting})"
        )
    if secagg and dp.mode == "server":
        raise ConfigError(
            "'privacy.dp.mode' server clips each client's update on the server, which "
            "SecAgg+ hides (the server sees only the sum); use mode: client (each client "
            "clips with fixedclipping_mod) with privacy.secagg"
        )


def secagg_setup(num_shares: int | float, threshold: int | float, num_samples: int) -> dict:
    """What Flower 1.42's ``SecAggPlusWorkflow.setup_stage`` makes of the SecAgg+
    parameters for a round that sends the model to ``num_samples`` clients (a
    transliteration of ``flwr/server/workflow/secure_aggregation/secaggplus_workflow.py``:
    ``_check_init_params``' int-1 → float-1.0, the share count of a proportion rounded and
    made odd, a threshold proportion rounded and at least 2, each client's neighbour set
    ``{(idx + o) mod n : |o| <= shares // 2}`` and ``_check_threshold``). Returns
    ``shares``, ``threshold``, ``neighbours`` (the size of each client's neighbour set,
    itself included) and ``reason``: ``None`` when the setup passes with every client
    answering, else why Flower halts the round."""
    if isinstance(num_shares, int) and not isinstance(num_shares, bool) and num_shares == 1:
        num_shares = 1.0
    if isinstance(threshold, int) and not isinstance(threshold, bool) and threshold == 1:
        threshold = 1.0
    n = int(num_samples)
    if n < 2:
        return {
            "shares": 0,
            "threshold": 0,
            "neighbours": n,
            "reason": f"SecAgg+ needs at least 2 clients, {n} was sent the model",
        }
    if isinstance(num_shares, float):
        shares = round(num_shares * n)
        if shares < n and shares & 1 == 0:
            shares += 1
        if shares <= 2:
            shares = n
    else:
        shares = int(num_shares)
    if isinstance(threshold, float):
        thr = max(round(threshold * shares), 2)
    else:
        thr = int(threshold)
    if n != shares and shares & 1 == 0:  # Flower: "should be odd"
        shares += 1
    neighbours = min(2 * (shares >> 1) + 1, n)
    reason = None
    if neighbours < thr:
        reason = (
            f"SecAgg+ threshold {thr} is unreachable with {n} clients (each client has "
            f"{neighbours} neighbours with {shares} shares)"
        )
    return {"shares": shares, "threshold": thr, "neighbours": neighbours, "reason": reason}


def secagg_upload_bytes(weights: list) -> int:
    """Bytes one client uploads under SecAgg+: Flower's masked vector, every entry of
    every array quantised, masked and sent as an int64, plus the int64 weight factor (flwr
    ``secaggplus_mod._collect_masked_vectors``: quantize -> factor_combine -> masks ->
    parameters_mod); the key and share exchange of the protocol's other stages is not
    counted."""
    return 8 * (1 + int(sum(np.asarray(w).size for w in weights)))


def check_secagg_plan(cfg) -> None:
    """SecAgg+ parameters that can never run a round with the configured clients per
    round (a ``ConfigError`` naming the key): ``privacy.secagg_num_shares`` above the
    clients per round (a count above it, a proportion above 1), or a
    ``privacy.secagg_threshold`` that Flower's setup (:func:`secagg_setup`) finds
    unreachable even when every sampled client answers. Fewer clients than sampled
    (``federation.availability``) are a run-time matter: such a round fails, recorded
    with its reason (``strategies/round_records.py``)."""
    from fedrcl_flwr.errors import ConfigError

    p = cfg.privacy
    n = cfg.federation.sampled_per_round()
    shares = p.secagg_num_shares
    if isinstance(shares, float) and shares > 1:
        raise ConfigError(
            f"'privacy.secagg_num_shares' as a proportion must be <= 1 (a share per "
            f"sampled client at most), got {shares!r}"
        )
    if not isinstance(shares, float) and shares > n:
        raise ConfigError(
            f"'privacy.secagg_num_shares' ({shares}) must be at most the clients per "
            f"round ({n}) as a count (or a proportion <= 1); SecAgg+ would halt every round"
        )
    plan = secagg_setup(shares, p.secagg_threshold, n)
    if plan["reason"] is not None:
        raise ConfigError(
            f"'privacy.secagg_threshold' ({p.secagg_threshold!r}): {plan['reason']}; "
            "Flower would halt every round (lower the threshold or raise "
            "privacy.secagg_num_shares)"
        )


def check_secagg_range(cfg, model) -> None:
    """SecAgg+ clips every model value to ±``secagg_clipping_range`` and quantises it in
    ``secagg_quantization_range`` levels (Flower's ``quantize``: step 2·range/levels):
    a range below the initial model's largest |w| clips the model itself (a range of
    1e-300 zeroes it), a step above :data:`MAX_SECAGG_STEP` rounds training away. Both are
    refused before the run (one line naming the key)."""
    import torch

    from fedrcl_flwr.errors import ConfigError

    p = cfg.privacy
    with torch.no_grad():
        largest = max(
            (float(v.detach().abs().max()) for v in model.state_dict().values() if v.numel()),
            default=0.0,
        )
    if p.secagg_clipping_range < largest:
        raise ConfigError(
            f"'privacy.secagg_clipping_range' ({p.secagg_clipping_range:g}) is below the "
            f"initial model's largest |weight| ({largest:.4g}, model.name={cfg.model.name}): "
            "SecAgg+ would clip the model itself; use a range above it (default 8)"
        )
    step = 2 * p.secagg_clipping_range / p.secagg_quantization_range
    if step > MAX_SECAGG_STEP:
        raise ConfigError(
            f"'privacy.secagg_clipping_range' {p.secagg_clipping_range:g} over "
            f"'privacy.secagg_quantization_range' {p.secagg_quantization_range} levels is a "
            f"quantisation step of {step:.3g} (> {MAX_SECAGG_STEP:g}): updates would round "
            "away; raise the levels or lower the range"
        )


def noise_std(noise_multiplier: float, clipping_norm: float, num_sampled: int) -> float:
    """Flower's ``compute_stdv``: σ·C/n, the std of the noise on each averaged entry."""
    return float(noise_multiplier * clipping_norm / num_sampled)


def gaussian_epsilon(noise_multiplier: float, count: int, delta: float) -> float:
    """ε at ``delta`` of ``count`` composed Gaussian mechanisms of noise multiplier σ
    (sensitivity 1, add/remove), from dp-accounting's RDP accountant; 0 for no release,
    ∞ for σ = 0."""
    if count <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return float("inf")
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()  # add/remove-one, the default orders
    acc.compose(dp_event.GaussianDpEvent(float(noise_multiplier)), int(count))
    return float(acc.get_epsilon(float(delta)))


class PrivacyAccountant:
    """Client-level (ε, δ) of a run's releases so far: per partition id, the number of
    released rounds it was sampled in; ε is that of the largest count (module doc)."""

    def __init__(self, noise_multiplier: float, delta: float, num_clients: int):
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.rounds = np.zeros(int(num_clients), dtype=np.int64)
        self.releases = 0

    def record_release(self, partition_ids) -> None:
        ids = np.asarray(list(partition_ids), dtype=np.int64)
        np.add.at(self.rounds, ids, 1)
        self.releases += 1

    @property
    def max_client_rounds(self) -> int:
        return int(self.rounds.max()) if len(self.rounds) else 0

    def epsilon(self) -> float:
        return gaussian_epsilon(self.noise_multiplier, self.max_client_rounds, self.delta)

    def record(self) -> dict:
        """What each round's record carries."""
        return {
            "dp_epsilon": self.epsilon(),
            "dp_delta": self.delta,
            "dp_max_client_rounds": self.max_client_rounds,
        }

    def state_dict(self) -> dict:
        return {"rounds": self.rounds.copy(), "releases": self.releases}

    def load_state_dict(self, state: dict) -> None:
        rounds = np.asarray(state["rounds"], dtype=np.int64)
        if rounds.shape != self.rounds.shape:
            raise ValueError(
                f"privacy accountant of {rounds.shape[0]} clients, the run has "
                f"{self.rounds.shape[0]}"
            )
        self.rounds = rounds.copy()
        self.releases = int(state["releases"])
