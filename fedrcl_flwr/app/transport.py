"""How weights travel between the strategy and the clients: inside Flower's messages
(``.npy`` bytes, :mod:`fedrcl_flwr.codec`) or by reference to the run's weight store
(:mod:`fedrcl_flwr.weight_store`, ``simulation.transport: shared``, issue 30).

The one place that translates between Flower's ``Parameters`` and arrays. Both kinds are
self-describing (``Parameters.tensor_type``): :data:`REF_TYPE` with one tensor, the JSON
reference; otherwise ``.npy`` bytes. So a receiver needs no setting:

* the server (``strategies/base.py``) sends through its :class:`ServerTransport` (by
  reference when it has a store, else bytes; a write that fails falls back to bytes for
  that message, with one warning) and reads every upload with :func:`open_upload` (the
  arrays, and the entry's hash check, which it finishes while averaging). On its
  first send it makes the store's arena of slots (:class:`~fedrcl_flwr.weight_store.
  Arena`: a ring for its sends, one slot per client of a round for the uploads) and
  tells each sampled client its upload slot inside that client's reference
  (:meth:`ServerTransport.for_client`). Without an arena (too big for the free memory)
  each entry is a file: it then deletes the round's uploads after averaging
  (:meth:`ServerTransport.release`) and keeps only the last two entries it published;
* a client (``clients/base.py``: ``WireClient``) reads what it got with :func:`arrays_of`
  and answers the same way it was addressed (:func:`reply`): into its upload slot, or a
  file of the same store when it was given none, when it received a reference (bytes if
  that write fails), else bytes.

:func:`choose` decides for a run and gives the one line the run's log shows: Flower's
messages when ``simulation.transport: flower``, under the Deployment Engine (real devices
share no memory), with ``simulation.ray_address`` (a cluster's nodes share no memory), with
SecAgg+ or client-side DP (Flower's mods need the bytes inside the message), or when the
store could not be created.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from flwr.common import Parameters

from fedrcl_flwr.codec import TENSOR_TYPE, decode_arrays, encode_arrays
from fedrcl_flwr.weight_store import (
    GLOBAL_SLOTS,
    Arena,
    Entry,
    HashCheck,
    StoreError,
    WeightStore,
    load,
    open_entry,
)

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


_LOADED: OrderedDict = OrderedDict()  # (store, hash) -> arrays: this process's last loads
_KEEP_LOADED = 2


def arrays_of(parameters: Parameters, *, reuse: bool = False) -> list[np.ndarray]:
    """The arrays a message carries (read-only views: of the message's bytes, or of the
    store entry's mapping after its hash was checked). ``reuse`` (a client): an entry
    this process mapped and checked lately is not mapped and hashed again (an actor
    trains several clients of a round on the same global model; a file entry is
    immutable, and a slot is rewritten only :data:`~fedrcl_flwr.weight_store.
    GLOBAL_SLOTS` sends later, after its round: a later send of the same hash into the
    same slot holds the same bytes)."""
    if not is_reference(parameters):
        return decode_arrays(parameters.tensors)
    ref = reference_of(parameters)
    if not reuse:
        return load(ref)
    key = (ref.get("store"), ref.get("hash"), ref.get("offset"), json.dumps(ref.get("arrays")))
    if key in _LOADED:
        _LOADED.move_to_end(key)
        return list(_LOADED[key])
    arrays = load(ref)
    _LOADED[key] = arrays
    while len(_LOADED) > _KEEP_LOADED:
        _LOADED.popitem(last=False)
    return list(arrays)


def open_upload(parameters: Parameters) -> tuple[list[np.ndarray], HashCheck | None]:
    """The server's read of an upload: the arrays (views) and, for a reference, the
    entry's :class:`~fedrcl_flwr.weight_store.HashCheck`, which the server finishes
    before it uses the arrays' values (``strategies/base.py``: while averaging); bytes
    inside the message need none (``None``)."""
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
        except OSError as exc:
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
            if entry.hash in self._in_slots:
                return self._in_slots[entry.hash]
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
