"""How weights travel between the strategy and the clients: inside Flower's messages
(``.npy`` bytes, :mod:`fedrcl_flwr.codec`) or by reference to the run's weight store
(:mod:`fedrcl_flwr.weights`, ``simulation.transport: shared``).

The one place that translates between Flower's ``Parameters`` and arrays. Both kinds are
self-describing (``Parameters.tensor_type``): :data:`REF_TYPE` with one tensor, the JSON
reference; otherwise ``.npy`` bytes. So a receiver needs no setting:

* the server (``strategies/base.py``) sends through its :class:`ServerTransport` (by
  reference when it has a store, else bytes; a write that fails falls back to bytes for
  that message, with one warning) and reads every upload with :func:`open_upload` (the
  arrays' shapes, and the entry's hash check, through which the average copies out and
  hashes every piece it averages) or :func:`arrays_of` (a checked copy). On its
  first send it makes the store's arena of slots (:class:`~fedrcl_flwr.weights.store.
  Arena`: a ring for its sends, one slot per client of a round for the uploads) and
  tells each sampled client its upload slot inside that client's reference
  (:meth:`ServerTransport.for_client`). Without an arena (too big for the free memory)
  each entry is a file: it then deletes the round's uploads after averaging
  (:meth:`ServerTransport.release`) and keeps only the last two entries it published;
* a client (``clients/wire_client.py``: ``WireClient``) reads what it got through
  :class:`Received`, on every use: copied out of the store into its model and hashed in
  the same pass, or (the received weights a method keeps) into arrays of its own; and
  answers the same way it was addressed (:func:`reply`): into its upload slot, or a file
  of the same store when it was given none, when it received a reference (bytes if that
  write fails), else bytes.

:func:`choose` decides for a run and gives the one line the run's log shows: Flower's
messages when ``simulation.transport: flower``, under the Deployment Engine (real devices
share no memory), with ``simulation.ray_address`` (a cluster's nodes share no memory), with
SecAgg+ or client-side DP (Flower's mods need the bytes inside the message), or when the
store could not be created.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np
from flwr.common import Parameters

from fedrcl_flwr.codec import TENSOR_TYPE, decode_arrays, encode_arrays
from fedrcl_flwr.weights.entries import GLOBAL_SLOTS, Entry, StoreError, check_reference
from fedrcl_flwr.weights.reading import HashCheck, intact, open_entry, read_entry
from fedrcl_flwr.weights.store import Arena, WeightStore

REF_TYPE = "fedrcl.weight-ref"  # Parameters.tensor_type of a reference
RUN_CONFIG_KEY = "weight-store"  # run config: the store's folder ("" = none)
RUN_CONFIG_NOTE = "weight-store-note"  # run config: why there is none (set by the runner)

log = logging.getLogger("fedrcl_flwr")


def to_bytes(arrays: Sequence) -> Parameters:
    """``arrays`` inside the message (``.npy`` bytes)."""
    return Parameters(tensors=encode_arrays(arrays), tensor_type=TENSOR_TYPE)


def is_reference(parameters: Parameters) -> bool:
    return parameters.tensor_type == REF_TYPE


def reference_of(parameters: Parameters) -> dict:
    if len(parameters.tensors) != 1:
        raise StoreError("a weight reference message must hold exactly one tensor")
    try:
        return json.loads(bytes(parameters.tensors[0]))
    except ValueError:
        raise StoreError("a weight reference message does not hold JSON") from None


def _as_parameters(ref: dict) -> Parameters:
    return Parameters(tensors=[json.dumps(ref).encode()], tensor_type=REF_TYPE)


def arrays_of(parameters: Parameters) -> list[np.ndarray]:
    """The arrays a message carries: read-only views of the message's bytes (this
    process's own), or a copy of the store entry the message names, hashed as it was
    copied (:func:`~fedrcl_flwr.weights.reading.read_entry`: the arrays are the bytes that
    hashed to the entry's name). Every call reads the store again."""
    if not is_reference(parameters):
        return decode_arrays(parameters.tensors)
    return read_entry(reference_of(parameters))


class Received:
    """The weights of one message as a client uses them, each read checked when it is
    made: :meth:`read_into` copies them into the client's model while it hashes them
    (one pass, no copy of its own), :meth:`arrays` gives them as arrays of this object's
    own (read, and checked, once; a method that keeps the received model, FedProx's
    anchor or MOON's global model). Both read the store again: a slot damaged between
    them is refused by the second (:class:`~fedrcl_flwr.weights.entries.StoreError`)."""

    def __init__(self, parameters: Parameters):
        self.parameters = parameters
        self._arrays: list[np.ndarray] | None = None

    @property
    def by_reference(self) -> bool:
        return is_reference(self.parameters)

    def shapes(self) -> list[tuple]:
        """The arrays' shapes, as the reference gives them (reads nothing else)."""
        if not self.by_reference:
            return [a.shape for a in self.arrays()]
        ref = check_reference(reference_of(self.parameters))
        try:
            return [tuple(int(n) for n in shape) for _, shape, _, _ in ref["arrays"]]
        except (TypeError, ValueError):
            raise StoreError("a weight reference with a malformed layout") from None

    def read_into(self, destinations: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """The arrays, each copied straight into ``destinations[i]`` where that is a
        writable C-contiguous array of its dtype and shape (returned as is), else into an
        array of its own; bytes in the message are returned as views (nothing to copy).
        Raises :class:`~fedrcl_flwr.weights.entries.StoreError` when the entry does not hash
        to its name (what was written into ``destinations`` must then not be used)."""
        if not self.by_reference:
            return self.arrays()
        return read_entry(reference_of(self.parameters), into=destinations)

    def arrays(self) -> list[np.ndarray]:
        if self._arrays is None:
            self._arrays = arrays_of(self.parameters)
        return list(self._arrays)


def open_upload(parameters: Parameters) -> tuple[list[np.ndarray], HashCheck | None]:
    """The server's read of an upload: the arrays and, for a reference, the entry's
    :class:`~fedrcl_flwr.weights.reading.HashCheck`. For a reference the arrays are views
    of the store, for their shapes only: every value is read through the check
    (``HashCheck.take``, the server's average) or with :func:`arrays_of`; bytes inside
    the message are the process's own and need none (``None``)."""
    if not is_reference(parameters):
        return decode_arrays(parameters.tensors), None
    return open_entry(reference_of(parameters))


def reply(arrays: Sequence, received: Parameters) -> Parameters:
    """A client's upload, sent the way its instructions came: by reference into the same
    store (into the slot the reference names as ``upload``, else a file), or (received
    bytes, or the write failed) as bytes."""
    if is_reference(received):
        try:
            ref = reference_of(received)
            store = WeightStore(ref["store"])
            slot = ref.get("upload")
            if slot is not None:
                try:
                    offset, capacity = (int(v) for v in slot)
                    return _as_parameters(store.publish_in_slot(Entry(arrays), offset, capacity))
                except (OSError, StoreError, TypeError, ValueError) as exc:
                    log.warning("weight store slot write failed (%s): this upload is a file", exc)
            return _as_parameters(store.publish(arrays))
        except (OSError, StoreError, KeyError) as exc:
            log.warning("weight store write failed (%s): this upload goes inside the message", exc)
    return to_bytes(arrays)


class ServerTransport:
    """The server's side: ``store`` ``None`` = Flower's messages."""

    KEEP = 2  # published entries kept (FedACG's look-ahead + the global model)

    def __init__(self, store: WeightStore | None = None, note: str = "", uploads: int = 0):
        self.store = store
        self.note = note
        self.uploads = uploads  # clients per round: the arena's upload slots
        self.arena: Arena | None = None
        self.arena_note = ""  # why there is no arena (decided on the first send)
        self._decided = False
        self._in_slots: dict[str, dict] = {}  # hash -> reference, of the ring's live slots
        self._published: list[dict] = []
        self._warned = False
        # slots found damaged when their model was sent again (the strategy reports and
        # clears them with the round)
        self.rewritten: list[str] = []

    @property
    def shared(self) -> bool:
        return self.store is not None

    def send(self, arrays: Sequence) -> Parameters:
        """``arrays`` for a message: by reference when there is a store (the entry
        stays until two newer ones were published), else bytes."""
        if self.store is None:
            return to_bytes(arrays)
        try:
            ref = self._publish(arrays)
        except (OSError, StoreError) as exc:
            if not self._warned:
                log.warning(
                    "weight store write failed (%s): weights go inside Flower's messages "
                    "until a write succeeds",
                    exc,
                )
                self._warned = True
            return to_bytes(arrays)
        if "offset" not in ref:
            self._published = [r for r in self._published if r["hash"] != ref["hash"]] + [ref]
            while len(self._published) > self.KEEP:
                self.store.remove(self._published.pop(0))
        return _as_parameters(ref)

    def prepare(self, model: Entry | Sequence) -> None:
        """Make the store's arena for entries of ``model``'s size (the run's model) and
        say so in :attr:`note`, or why there is none; once, before the first send (or on
        it)."""
        if self._decided or self.store is None:
            return
        self._decided = True
        entry = model if isinstance(model, Entry) else Entry(model)
        made = Arena.create(self.store, entry.size, self.uploads) if self.uploads else None
        if isinstance(made, Arena):
            self.arena = made
            self.note += (
                f" ({GLOBAL_SLOTS + 2 * self.uploads} slots of "
                f"{made.slot_size / 2**20:.1f} MiB in one file)"
            )
        else:
            self.arena_note = made or "no upload slots asked for"
            self.note += f" (one file per entry: {self.arena_note})"

    def _publish(self, arrays: Sequence) -> dict:
        """``arrays`` into the arena's ring (made on the first send; unless a live slot
        already holds them), else as a file."""
        assert self.store is not None
        entry = Entry(arrays)
        if not self._decided:
            self.prepare(entry)
        if self.arena is not None and entry.size <= self.arena.slot_size:
            live = self._in_slots.get(entry.hash)
            if live is not None and intact(live):
                return live
            if live is not None:  # the slot no longer holds what was written there
                self.rewritten.append(
                    f"the weight store slot at offset {live['offset']} no longer held the "
                    f"model sent there (entry {entry.hash[:12]}): sent again in a new slot"
                )
                log.warning("%s", self.rewritten[-1])
            offset = self.arena.next_global_offset()
            ref = self.store.publish_in_slot(entry, offset, self.arena.slot_size)
            self._in_slots = {h: r for h, r in self._in_slots.items() if r["offset"] != offset}
            self._in_slots[entry.hash] = ref
            return ref
        return self.store.publish(arrays)

    def for_client(self, send: Parameters, run_round: int, index: int) -> Parameters:
        """``send`` for the ``index``-th client of round ``run_round``: with an arena, the
        reference plus that client's upload slot (``upload: [offset, capacity]``)."""
        if self.arena is None or not is_reference(send):
            return send
        offset = self.arena.upload_offset(run_round, index)
        if offset is None:
            return send
        ref = reference_of(send)
        return _as_parameters({**ref, "upload": [offset, self.arena.slot_size]})

    def result(self, arrays: Sequence) -> Parameters:
        """What ``aggregate_fit`` hands back to Flower's server loop, which only keeps
        it (the strategy holds the global model and sends :meth:`send` of it): bytes
        as before with Flower's messages; with the store an empty reference, so the
        round's model is neither encoded nor written for nobody."""
        if self.store is None:
            return to_bytes(arrays)
        return Parameters(tensors=[], tensor_type=REF_TYPE)

    def release(self, results) -> None:
        """Delete the store entries of a round's uploads (``(proxy, FitRes)`` pairs) once
        averaged (what was mapped stays readable)."""
        if self.store is None:
            return
        mine = {r["hash"] for r in self._published}
        for _, res in results:
            params = getattr(res, "parameters", None)
            if params is None or not is_reference(params):
                continue
            try:
                ref = reference_of(params)
            except StoreError:
                continue
            if (
                "offset" not in ref  # a slot is reused, not deleted
                and ref.get("hash") not in mine
                and ref.get("store") == str(self.store.root)
            ):
                self.store.remove(ref)


def choose(cfg, run_config: dict, *, simulation: bool, uploads: int = 0) -> ServerTransport:
    """The run's transport, and in ``.note`` the line the run's log shows (why);
    ``uploads``: clients per round (the arena's upload slots)."""
    why = fallback_reason(cfg, simulation=simulation)
    root = str(run_config.get(RUN_CONFIG_KEY, "") or "")
    if why is None and not root:
        why = str(run_config.get(RUN_CONFIG_NOTE, "") or "") or "no weight store was created"
        why = f"the weight store could not be created ({why})"
    if why is not None:
        return ServerTransport(None, f"weights travel inside Flower's messages: {why}")
    return ServerTransport(
        WeightStore(root), f"weights travel by reference through {root}", uploads=uploads
    )


def fallback_reason(cfg, *, simulation: bool = True) -> str | None:
    """Why the run cannot carry weights by reference (``None``: it can)."""
    dp = cfg.privacy.dp
    if cfg.simulation.transport == "flower":
        return "simulation.transport: flower"
    if not simulation:
        return "the Deployment Engine (real devices share no memory)"
    if cfg.simulation.ray_address:
        return "simulation.ray_address is set (a Ray cluster's nodes share no memory)"
    if cfg.privacy.secagg:
        return "privacy.secagg (SecAgg+ masks the weights inside the message)"
    if dp is not None and dp.mode == "client":
        return "privacy.dp.mode: client (Flower's fixedclipping_mod clips the message's weights)"
    return None
