"""The client <-> server protocol: what travels in Flower's messages, declared once.

Flower carries four things between the ServerApp and a ClientApp for this project:

* **fit instructions** (:class:`FitInstructions`, the ``config`` of Flower's ``FitIns``):
  the run's round, the partition a simulated client trains on, an optional learning
  rate, the signal exchange's banked signals and the server strategy's own values for the
  clients (a :class:`StrategyParams` dataclass the strategy declares: FedACG's β,
  FedDyn's α);
* the **fit report** (:class:`FitReport`, the ``metrics`` of Flower's ``FitRes``): the
  partition id, the training loss, steps, time and node, the loss of each named
  ``LossTerm``, the local-model representation metrics, the uploaded signals and the
  method's own metrics;
* **evaluate instructions** (:class:`EvaluateInstructions`, ``EvaluateIns.config``): the
  round and the partitions one node evaluates (per-client evaluation,
  ``fedrcl_flwr/client_eval.py``);
* the **evaluate report** (:class:`EvaluateReport`, ``EvaluateRes.metrics``): per
  partition ``(correct, samples, loss sum)``.

Flower's values are flat ``str -> Scalar`` dicts (``Scalar = bool | bytes | float | int |
str``). The encoding, one place for all of it:

=====================  ====================================================================
wire entry             meaning (type)
=====================  ====================================================================
``run_round``          the run's round, shifted on resume (int)
``partition_id``       the partition a simulated client trains on this round (int)
``lr``                 a learning rate replacing the round's schedule (float, optional)
``signals_local``      banked local signals, ``fedrcl_flwr.signals`` ``.npz`` bytes
``signals_global``     the global signals, same encoding
(strategy fields)      each field of the strategy's :class:`StrategyParams`, by its name
``train_loss``         the client's mean training loss (float)
``steps``              local optimisation steps (int)
``fit_time_s``         wall time of the client's ``fit`` (float)
``node``               where the client ran (``runtime.node_name()``, str)
``loss_<term>``        the mean of one named loss term (float)
``local_repr_<name>``  a representation metric of the trained local model (float)
``signals``            the client's uploaded signals (``.npz`` bytes)
``num_signals``        how many signals it uploaded (int)
``partition_ids``      comma-separated partitions one node evaluates (str)
``client_eval``        JSON ``{partition id: [correct, samples, loss sum]}`` (str)
=====================  ====================================================================

Every other entry of a fit report is a metric of the method (``moon_prev``,
``feddyn_state``, ...); it may not reuse a protocol name or prefix. Entries Flower adds to
the fit config itself (its client-side DP clipping norm) pass through untouched.

A client whose ``fit`` raised reaches the server as an error line (Flower keeps only the
exception's text); :func:`tag_partition` puts the client's partition in front of it
(``[partition 17] RuntimeError: ...``) and :func:`untag_partition` reads it back, so the
server counts each partition's failures.

The number of examples a client reports (Flower's ``num_examples``, the weight of its
upload) is :func:`upload_weight`. No Flower here: ``clients/base.py`` and
``strategies/base.py`` put these values into Flower's messages and read them back.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

Scalar = bool | bytes | float | int | str

# -------------------------------------------------------------------------- wire names
RUN_ROUND = "run_round"
PARTITION_ID = "partition_id"
SIGNALS_LOCAL = "signals_local"
SIGNALS_GLOBAL = "signals_global"
FIT_INSTRUCTION_KEYS = (RUN_ROUND, PARTITION_ID, SIGNALS_LOCAL, SIGNALS_GLOBAL)

TRAIN_LOSS = "train_loss"
STEPS = "steps"
FIT_TIME = "fit_time_s"
NODE = "node"
SIGNALS = "signals"
NUM_SIGNALS = "num_signals"
TERM_LOSS_PREFIX = "loss_"
LOCAL_REPR_PREFIX = "local_repr_"
FIT_REPORT_KEYS = (PARTITION_ID, TRAIN_LOSS, STEPS, FIT_TIME, NODE, SIGNALS, NUM_SIGNALS)
FIT_REPORT_PREFIXES = (TERM_LOSS_PREFIX, LOCAL_REPR_PREFIX)

PARTITION_IDS = "partition_ids"
CLIENT_EVAL = "client_eval"


class ProtocolError(ValueError):
    """A message that does not follow the protocol (the entry is named)."""


def _as_number(entries: Mapping[str, Any], key: str, kind: type, default: Any | None = None) -> Any:
    """``entries[key]`` as ``kind`` (``int`` or ``float``); ``default`` when absent."""
    value = entries.get(key, default)
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        what = "a whole number" if kind is int else "a number"
        raise ProtocolError(f"'{key}' must be {what}, got {value!r}") from None


def _as_bytes(entries: Mapping[str, Any], key: str) -> bytes | None:
    value = entries.get(key)
    if value is None or isinstance(value, bytes):
        return value
    raise ProtocolError(f"'{key}' must be bytes, got {type(value).__name__}")


# ----------------------------------------------------------- the strategy's own values
P = TypeVar("P", bound="StrategyParams")


@dataclass(frozen=True)
class StrategyParams:
    """Base of the values a server strategy sends every client in its fit instructions:
    a frozen dataclass whose fields (``float``, ``int``, ``bool`` or ``str``) travel as
    fit-config entries named by the field (``FedACGParams.acg_beta`` ->
    ``"acg_beta"``). The strategy returns one from ``client_params``; the client reads it
    with ``FitInstructions.strategy_params(TheClass)``."""

    def to_entries(self) -> dict[str, Scalar]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_entries(cls: type[P], entries: Mapping[str, Any]) -> P:
        """The declared fields from ``entries`` (a :class:`ProtocolError` naming a missing
        or mistyped entry)."""
        hints = get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in entries:
                raise ProtocolError(
                    f"the fit instructions lack '{f.name}' ({cls.__name__}: "
                    "is the configured server.strategy the one that sends it?)"
                )
            values[f.name] = _typed_field(cls.__name__, f.name, hints[f.name], entries[f.name])
        return cls(**values)


def _typed_field(owner: str, name: str, kind: Any, value: Any) -> Scalar:
    ok = {
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        bool: lambda v: isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }
    if kind not in ok:
        raise TypeError(
            f"{owner}.{name}: a strategy parameter must be float, int, bool or str, not {kind!r}"
        )
    if not ok[kind](value):
        raise ProtocolError(f"'{name}' ({owner}) must be {kind.__name__}, got {value!r}")
    return kind(value)


# ------------------------------------------------------------------ fit instructions
@dataclass(frozen=True)
class FitInstructions:
    """Server -> client, with the global weights (Flower's ``FitIns.config``)."""

    run_round: int = 1
    partition_id: int | None = None  # None: the node's own partition (node config)
    signals_local: bytes | None = None  # encoded SignalSet (fedrcl_flwr.signals)
    signals_global: bytes | None = None
    strategy_entries: Mapping[str, Scalar] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        run_round: int,
        partition_id: int,
        *,
        strategy: StrategyParams | None = None,
        signals: tuple[bytes | None, bytes | None] = (None, None),
    ) -> FitInstructions:
        """What the server sends one client: the round, its partition, the signal
        exchange's ``(local, global)`` signals and the strategy's :class:`StrategyParams`."""
        return cls(
            run_round=int(run_round),
            partition_id=int(partition_id),
            signals_local=signals[0],
            signals_global=signals[1],
            strategy_entries=strategy.to_entries() if strategy is not None else {},
        )

    def to_config(self) -> dict[str, Scalar]:
        clash = sorted(set(self.strategy_entries) & set(FIT_INSTRUCTION_KEYS))
        if clash:
            raise ProtocolError(f"strategy entries reuse protocol names: {clash}")
        config: dict[str, Scalar] = {RUN_ROUND: self.run_round}
        optional = (
            (PARTITION_ID, self.partition_id),
            (SIGNALS_LOCAL, self.signals_local),
            (SIGNALS_GLOBAL, self.signals_global),
        )
        config.update({k: v for k, v in optional if v is not None})
        config.update(self.strategy_entries)
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FitInstructions:
        """The instructions in a fit config; every entry that is not a protocol name is
        kept in ``strategy_entries`` (the strategy's fields, Flower's own entries)."""
        return cls(
            run_round=_as_number(config, RUN_ROUND, int, 1),
            partition_id=_as_number(config, PARTITION_ID, int, None),
            signals_local=_as_bytes(config, SIGNALS_LOCAL),
            signals_global=_as_bytes(config, SIGNALS_GLOBAL),
            strategy_entries={k: v for k, v in config.items() if k not in FIT_INSTRUCTION_KEYS},
        )

    def strategy_params(self, kind: type[P]) -> P:
        """The strategy's values, as the :class:`StrategyParams` subclass ``kind``."""
        return kind.from_entries(self.strategy_entries)


# ------------------------------------------------------------------------ fit report
@dataclass
class FitReport:
    """Client -> server, with the trained weights (Flower's ``FitRes.metrics``). Missing
    entries read as unknown: a partition id of -1, no training loss, no node."""

    partition_id: int = -1
    train_loss: float | None = None
    steps: int | None = None
    fit_time_s: float | None = None
    node: str | None = None
    term_losses: dict[str, float] = field(default_factory=dict)  # LossTerm name -> mean
    local_repr: dict[str, float] = field(default_factory=dict)  # metric -> local model's
    signals: Scalar | None = None  # encoded SignalSet; validated by the SignalExchange
    num_signals: int | None = None
    method_metrics: dict[str, Scalar] = field(default_factory=dict)

    def to_metrics(self) -> dict[str, Scalar]:
        """Flower's fit metrics; a method metric may not reuse a protocol name/prefix."""
        bad = sorted(
            k
            for k in self.method_metrics
            if k in FIT_REPORT_KEYS or k.startswith(FIT_REPORT_PREFIXES)
        )
        if bad:
            raise ProtocolError(
                f"method metrics reuse protocol names: {bad} (see fedrcl_flwr/protocol.py)"
            )
        metrics: dict[str, Scalar] = {PARTITION_ID: self.partition_id}
        base = (
            (TRAIN_LOSS, self.train_loss),
            (STEPS, self.steps),
            (FIT_TIME, self.fit_time_s),
            (NODE, self.node),
        )
        metrics.update({k: v for k, v in base if v is not None})
        metrics.update({TERM_LOSS_PREFIX + k: v for k, v in self.term_losses.items()})
        metrics.update({LOCAL_REPR_PREFIX + k: v for k, v in self.local_repr.items()})
        if self.signals is not None:
            metrics[SIGNALS] = self.signals
            metrics[NUM_SIGNALS] = int(self.num_signals or 0)
        metrics.update(self.method_metrics)
        return metrics

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> FitReport:
        """The report in a client's fit metrics (a :class:`ProtocolError` naming a
        malformed entry). Term losses keep numbers only; a ``node`` that is not text is
        unknown."""
        report = cls(
            partition_id=_as_number(metrics, PARTITION_ID, int, -1),
            train_loss=_as_number(metrics, TRAIN_LOSS, float),
            steps=_as_number(metrics, STEPS, int, None),
            fit_time_s=_as_number(metrics, FIT_TIME, float),
            node=metrics[NODE] if isinstance(metrics.get(NODE), str) else None,
            signals=metrics.get(SIGNALS),
            num_signals=_as_number(metrics, NUM_SIGNALS, int, None),
        )
        for key, value in metrics.items():
            if key.startswith(TERM_LOSS_PREFIX):
                if isinstance(value, (int, float)):
                    report.term_losses[key[len(TERM_LOSS_PREFIX) :]] = value
            elif key.startswith(LOCAL_REPR_PREFIX):
                report.local_repr[key[len(LOCAL_REPR_PREFIX) :]] = _as_number(metrics, key, float)
            elif key not in FIT_REPORT_KEYS:
                report.method_metrics[key] = value
        return report


def upload_weight(num_samples: int, *, secagg: bool, weighting: str) -> int:
    """The ``num_examples`` a client reports with its weights: its number of training
    samples, or 1 under SecAgg+ with ``server.weighting: uniform`` (SecAgg+ weights each
    masked upload by it, so equal weights are 1 each; ``privacy.secagg_max_weight`` is
    then 1 too, ``fedrcl_flwr/app/validate.py``)."""
    return 1 if secagg and weighting == "uniform" else int(num_samples)


# ------------------------------------------------------------- evaluate instructions
@dataclass(frozen=True)
class EvaluateInstructions:
    """Server -> client for per-client evaluation (Flower's ``EvaluateIns.config``): the
    round, and the partitions this node evaluates (simulation: one message may name
    several; ``None``: the node's own)."""

    run_round: int = 0
    partition_ids: tuple[int, ...] | None = None
    partition_id: int | None = None  # a single partition (older servers / tests)

    def to_config(self) -> dict[str, Scalar]:
        config: dict[str, Scalar] = {RUN_ROUND: self.run_round}
        if self.partition_ids is not None:
            config[PARTITION_IDS] = ",".join(str(int(p)) for p in self.partition_ids)
        if self.partition_id is not None:
            config[PARTITION_ID] = self.partition_id
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EvaluateInstructions:
        text = config.get(PARTITION_IDS)
        try:
            ids = None if text is None else tuple(int(t) for t in str(text).split(",") if t.strip())
        except ValueError:
            raise ProtocolError(
                f"'{PARTITION_IDS}' must be comma-separated whole numbers, got {text!r}"
            ) from None
        return cls(
            run_round=_as_number(config, RUN_ROUND, int, 0),
            partition_ids=ids,
            partition_id=_as_number(config, PARTITION_ID, int, None),
        )


# ------------------------------------------------------------------- evaluate report
ClientEvalResult = tuple[int, int, float]  # (correct, samples, loss sum) of one partition


@dataclass
class EvaluateReport:
    """Client -> server: per partition id ``(correct, samples, loss sum)`` on its local
    test data (Flower's ``EvaluateRes.metrics``, ``client_eval``: JSON text)."""

    results: dict[int, ClientEvalResult] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return sum(r[1] for r in self.results.values())

    @property
    def mean_loss(self) -> float:
        """The loss per test sample over every partition (0 without samples)."""
        n = self.num_samples
        return sum(r[2] for r in self.results.values()) / n if n else 0.0

    def to_metrics(self) -> dict[str, Scalar]:
        return {CLIENT_EVAL: encode_client_eval(self.results)}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> EvaluateReport:
        """Malformed entries are left out (the server counts an empty report from a
        client with samples as a failure)."""
        return cls(decode_client_eval(metrics.get(CLIENT_EVAL)))


def encode_client_eval(results: Mapping[int, ClientEvalResult]) -> str:
    """``{partition id: (correct, samples, loss sum)}`` as the ``client_eval`` JSON."""
    return json.dumps(
        {str(int(k)): [int(c), int(n), float(s)] for k, (c, n, s) in sorted(results.items())}
    )


def decode_client_eval(text: Any) -> dict[int, ClientEvalResult]:
    """Inverse of :func:`encode_client_eval`; malformed entries are left out."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return {}
    out: dict[int, ClientEvalResult] = {}
    if not isinstance(data, dict):
        return out
    for k, v in data.items():
        try:
            c, n, s = v
            pid, c, n, s = int(k), int(c), int(n), float(s)
        except (TypeError, ValueError):
            continue
        if 0 <= c <= n:
            out[pid] = (c, n, s)
    return out


# ------------------------------------------------------------------ a failed client
_PARTITION_TAG = re.compile(r"\[partition (\d{1,12})\] ")


def tag_partition(partition_id: int, line: str) -> str:
    """The error ``line`` of a client that failed on partition ``partition_id``."""
    return f"[partition {int(partition_id)}] {line}"


def untag_partition(line: str) -> tuple[int | None, str]:
    """``(partition id, line)`` of a :func:`tag_partition` line; ``(None, line)`` for any
    other line."""
    m = _PARTITION_TAG.match(line)
    if m is None:
        return None, line
    return int(m.group(1)), line[m.end() :]
