"""The Flower ``Client`` a method's client is run as (:class:`WireClient`, what
:meth:`clients.base.FederatedClient.to_client` returns): what Flower's ``NumPyClient``
wrapper does, with the weights in and out through :mod:`fedrcl_flwr.codec` or by reference
to the run's weight store (:mod:`fedrcl_flwr.app.wire.transport`)."""

from __future__ import annotations

from flwr.client import Client
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    Parameters,
    Status,
)

from fedrcl_flwr.app.wire import transport
from fedrcl_flwr.codec import TENSOR_TYPE, encode_arrays
from fedrcl_flwr.run import timers


class WireClient(Client):
    """A :class:`~clients.base.FederatedClient` (``numpy_client``) as the Flower ``Client``
    its :meth:`~clients.base.FederatedClient.to_client` returns: what Flower's
    ``NumPyClient`` wrapper does, with the weights in and out through
    :mod:`fedrcl_flwr.codec` (the same ``.npy`` bytes, three copies of the model fewer per
    message; the received weights are read-only views of the message), or by reference to
    the run's weight store (``simulation.transport: shared``:
    :mod:`fedrcl_flwr.app.wire.transport`; the upload goes back the way the instructions
    came). Both runners hand every fit to it, the ClientApp and the in-process one."""

    def __init__(self, numpy_client):
        self.numpy_client = numpy_client

    @staticmethod
    def _ok() -> Status:
        return Status(code=Code.OK, message="Success")

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        arrays = self.numpy_client.get_parameters(config=ins.config)
        return GetParametersRes(
            status=self._ok(),
            parameters=Parameters(tensors=encode_arrays(arrays), tensor_type=TENSOR_TYPE),
        )

    def fit(self, ins: FitIns) -> FitRes:
        """The round's training (:meth:`~clients.base.FederatedClient.train_round`, handed
        the message's weights as :class:`~fedrcl_flwr.app.wire.transport.Received`: read
        from the weight store into the model, and checked, when they are used), then its
        upload (:meth:`~clients.base.FederatedClient.upload`: views of the model) written
        out at once, into the message or the weight store, so no copy of the model is made
        for it."""
        client = self.numpy_client
        client.partition_id = -1  # set by the round's start (clients.local_round.start_round)
        try:
            return self._fit(client, ins)
        except Exception as exc:
            # the server counts each client's failures (strategies/screening.py: client_failure)
            if client.partition_id >= 0 and not hasattr(exc, "partition_id"):
                try:
                    exc.partition_id = client.partition_id  # type: ignore[attr-defined]
                except AttributeError:  # an exception type without attributes
                    pass
            raise

    def _fit(self, client, ins: FitIns) -> FitRes:
        out = client.train_round(transport.Received(ins.parameters), ins.config)
        if not (len(out) == 2 and isinstance(out[0], int) and isinstance(out[1], dict)):
            raise TypeError(f"{type(client).__name__}.train_round must return (int, dict)")
        num_examples, metrics = out
        weights = client.upload()
        if not isinstance(weights, list):
            raise TypeError(f"{type(client).__name__}.upload must return a list of arrays")
        with timers.stage("encode"):  # after t_fit_end: inside its "encode" share
            parameters = transport.reply(weights, ins.parameters)
        return FitRes(
            status=self._ok(),
            parameters=parameters,
            num_examples=num_examples,
            metrics=metrics,
        )

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        out = self.numpy_client.evaluate(transport.arrays_of(ins.parameters), ins.config)
        if not (
            len(out) == 3
            and isinstance(out[0], float)
            and isinstance(out[1], int)
            and isinstance(out[2], dict)
        ):
            raise TypeError(
                f"{type(self.numpy_client).__name__}.evaluate must return (float, int, dict)"
            )
        loss, num_examples, metrics = out
        return EvaluateRes(status=self._ok(), loss=loss, num_examples=num_examples, metrics=metrics)
