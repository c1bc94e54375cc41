"""Weights by reference (``simulation.transport: shared``) against Flower's messages
(``flower``), in process: the same numbers for every method family, the store refuses
damaged / truncated / foreign entries and special files with one clear line, on every
read, the fallbacks and their log lines, the store's directory is the run's own, and
nothing is left in ``/dev/shm``. (The real runs: ``tests/e2e/test_cli_run.py``; the SIGKILL
teardown in ``tests/e2e/test_process_teardown.py``.)"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_SYNTHETIC

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.app.wire import transport
from fedrcl_flwr.config import config_from_dict
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.weights.entries import StoreError
from fedrcl_flwr.weights.lifecycle import SHM, create_store, remove_store, stores_of
from fedrcl_flwr.weights.reading import load
from fedrcl_flwr.weights.store import WeightStore

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    np.array(3, dtype=np.int64),  # 0-d (a BatchNorm counter)
    np.zeros((0, 5), np.float32),
    np.array([True, False, True]),
    np.linspace(-1, 1, 9, dtype=np.float64).reshape(3, 3).T,  # not C-contiguous
    np.arange(5, dtype=">i4"),  # big-endian
]


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")} for r in recs]


@pytest.fixture
def store(tmp_path):
    return WeightStore(tmp_path)


# ---------------------------------------------------------------- same numbers
CASES = {
    # a signal-exchanging method, FedACG's look-ahead, per-client evaluation
    "fedccl+fedacg+per_client": dict(
        client={"method": "fedccl"},
        server={"strategy": "fedacg"},
        evaluation={"target_rounds": [2], "per_client": {"every": 1}},
    ),
    "feddyn": dict(client={"method": "feddyn"}, server={"strategy": "feddyn"}),
}
SMALL = {"synthetic": {**TINY_SYNTHETIC, "num_train": 400, "num_test": 100}}
# enough rounds that every arena slot is written again (uploads: every other round; the
# ring of sends after GLOBAL_SLOTS sends)
ROUNDS = 4


def _run(tiny, out: Path, how: str, *, resume=False, stop_after=None, **sections):
    cfg = tiny(
        federation={"rounds": ROUNDS},
        simulation={"transport": how},
        dataset={"name": "synthetic", **SMALL},
        **sections,
    )
    st = run_inprocess(cfg, out, resume=resume, stop_after=stop_after)
    assert st.transport.shared == (how == "shared")
    assert (st.transport.arena is not None) == (how == "shared")  # the slots were used
    if st.transport.shared:  # the run's store was in /dev/shm and is gone
        assert st.transport.store.root.parent == SHM
        assert not st.transport.store.root.exists()
        from fedrcl_flwr.weights import mappings  # and this process keeps no handle of it

        arena = str(st.transport.store.root / "arena")
        assert arena not in mappings._MAPS and arena not in mappings._WRITERS
    return st


def _same(a, b, out_a: Path, out_b: Path) -> list[dict]:
    ra, rb = read_metrics(out_a), read_metrics(out_b)
    assert len(ra) == ROUNDS and _strip(ra) == _strip(rb)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a.weights, b.weights))
    return ra


@pytest.mark.parametrize("case", sorted(CASES))
def test_transports_give_identical_numbers(tiny, tmp_path, case):
    a = _run(tiny, tmp_path / "shared", "shared", **CASES[case])
    b = _run(tiny, tmp_path / "flower", "flower", **CASES[case])
    recs = _same(a, b, tmp_path / "shared", tmp_path / "flower")
    if "per_client" in case:
        assert "client_acc_mean" in recs[0]


def test_resumed_shared_run_equals_uninterrupted_flower_run(tiny, tmp_path):
    """FedAvg with server-side DP (no noise: Flower draws it from the OS); the resumed
    run has a store of its own, and a stale entry cannot be read (the hash decides)."""
    kw = dict(
        output={"checkpoint_every": 1},
        privacy={"dp": {"mode": "server", "noise_multiplier": 0.0, "clipping_norm": 0.5}},
    )
    _run(tiny, tmp_path / "cut", "shared", stop_after=3, **kw)
    assert len(read_metrics(tmp_path / "cut")) == 3
    a = _run(tiny, tmp_path / "cut", "shared", resume=True, **kw)
    b = _run(tiny, tmp_path / "full", "flower", **kw)
    recs = _same(a, b, tmp_path / "cut", tmp_path / "full")
    assert "dp_epsilon" in recs[0]


# ---------------------------------------------------------------- the store
def test_publish_then_load_gives_the_same_arrays_read_only(store):
    ref = store.publish(ARRAYS)
    assert len(json.dumps(ref)) < 2000 and ref["hash"] in store.entries()
    got = load(ref)
    for a, b in zip(ARRAYS, got):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        assert not b.flags.writeable
    assert all(off % 64 == 0 for _, _, off, _ in ref["arrays"])
    # the same content: the same name, written once
    assert store.publish([a.copy() for a in ARRAYS])["hash"] == ref["hash"]
    assert len(store.entries()) == 1
    store.remove(ref)
    assert store.entries() == [] and np.array_equal(got[0], ARRAYS[0])  # mapping lives on


def _refused(ref, match):
    with pytest.raises(StoreError, match=match) as err:
        load(ref)
    assert "\n" not in str(err.value)


def test_damaged_truncated_and_foreign_entries_are_refused(store):
    ref = store.publish(ARRAYS)
    path = store.path(ref["hash"])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    _refused(ref, "does not hash to its name")
    path.write_bytes(bytes(data[:-10]))
    _refused(ref, "truncated or foreign")
    other = store.publish([a + 1 for a in ARRAYS[:1]] + ARRAYS[1:])  # same size, other content
    shutil.copy(store.path(other["hash"]), path)
    _refused(ref, "does not hash to its name")
    path.unlink()
    _refused(ref, "cannot open")
    # a reference whose layout is not the entry's, and references that are not ones
    _refused({**other, "arrays": other["arrays"][:-1]}, "layout differs")
    _refused({**other, "hash": "../" + other["hash"][3:]}, "not a xxh3_128 digest|not a sha256")
    _refused({**other, "store": "relative/dir"}, "not an absolute path")
    _refused({"hash": other["hash"]}, "needs 'store'")


def test_a_damaged_upload_is_dropped_with_the_reason(store, tmp_path):
    """The strategy's screen sees a one-line reason (the round goes on without it)."""
    from flwr.common import Code, FitRes, Status

    ref = store.publish(ARRAYS)
    store.path(ref["hash"]).write_bytes(b"x" * ref["size"])
    params = transport.Parameters(
        tensors=[json.dumps(ref).encode()], tensor_type=transport.REF_TYPE
    )
    with pytest.raises(StoreError, match="damaged or foreign"):
        transport.arrays_of(params)
    res = FitRes(Status(Code.OK, ""), params, 1, {})
    from strategies.base import FederatedStrategy
    from strategies.screening import screen

    st = FederatedStrategy(
        initial_weights=ARRAYS[:1],
        trainable=[True],
        num_clients=2,
        clients_per_round=1,
        rounds=1,
    )
    reasons: list[str] = []
    from fedrcl_flwr.protocol import FitReport

    res.metrics = FitReport(partition_id=0, train_loss=0.1).to_metrics()
    assert screen([(None, res)], st.weights, reasons) == []
    assert "undecodable parameters (weight store entry" in reasons[0], reasons


def test_store_of_a_run_is_its_own_marked_directory_and_goes_with_teardown(tmp_path):
    """The store's name is unpredictable (``mkdtemp``: a planted directory cannot be
    taken for it), it is mode 0700, marked with its owners and home, found by its home
    and removed by the run's teardown."""
    import stat

    from fedrcl_flwr.launch.processes import HOME_PREFIX, teardown

    home = tmp_path / f"{HOME_PREFIX}test{tmp_path.name}"
    home.mkdir()
    a, b = create_store(home=home), create_store(home=home)
    assert a.root != b.root and a.root.parent == SHM
    assert a.root.name.startswith("fedrcl-flwr-store-") and len(a.root.name) > 25
    assert stat.S_IMODE(a.root.stat().st_mode) == 0o700
    assert sorted(stores_of(home)) == sorted([a.root, b.root])
    a.publish(ARRAYS)
    teardown(home, [])
    assert not a.root.exists() and not b.root.exists() and not home.exists()


def test_a_directory_the_run_did_not_make_is_never_removed(tmp_path, monkeypatch):
    """A directory planted where the store could go (its old name was the home's name,
    visible in ``/tmp`` and in the watchdog's command line) is neither used nor removed,
    by the store's failure path or by teardown; ``remove_store`` removes only a marked
    store (of the home it is told)."""
    from fedrcl_flwr.launch.processes import HOME_PREFIX, teardown
    from fedrcl_flwr.weights import lifecycle

    home = tmp_path / f"{HOME_PREFIX}planted"
    home.mkdir()
    planted = SHM / home.name  # the name a store had before
    planted.mkdir()
    (planted / "user-file").write_text("keep me")
    try:
        store = create_store(home=home)
        assert store.root != planted and (planted / "user-file").is_file()
        teardown(home, [])
        assert (planted / "user-file").read_text() == "keep me"
        home.mkdir()
        # /dev/shm refuses the store (full): the failure path removes only what it made
        real = lifecycle._write_new
        calls = []

        def full_once(path, data):
            calls.append(path)
            if len(calls) == 1:
                raise OSError(28, "No space left on device")
            return real(path, data)

        monkeypatch.setattr(lifecycle, "_write_new", full_once)
        store = create_store(home=home)
        assert store.root.parent == home and not calls[0].parent.exists()
        assert not remove_store(planted) and not remove_store(store.root, home=tmp_path)
        teardown(home, [])
        assert not home.exists()
        assert (planted / "user-file").read_text() == "keep me"
    finally:
        shutil.rmtree(planted, ignore_errors=True)


# ---------------------------------------------------------------- fallbacks
def _cfg(tiny, **kw):
    return tiny(**kw)


@pytest.mark.parametrize(
    "sections,simulation,why",
    [
        ({"simulation": {"transport": "flower"}}, True, "simulation.transport: flower"),
        ({}, False, "Deployment Engine"),
        ({"simulation": {"ray_address": "head:6379"}}, True, "ray_address"),
        ({"privacy": {"secagg": True}}, True, "SecAgg"),
        (
            {"privacy": {"dp": {"mode": "client", "noise_multiplier": 0.0, "clipping_norm": 1}}},
            True,
            "fixedclipping_mod",
        ),
    ],
)
def test_fallback_to_flower_messages_names_why(tiny, sections, simulation, why):
    cfg = _cfg(tiny, **sections)
    t = transport.choose(cfg, {transport.RUN_CONFIG_KEY: "/dev/shm/x"}, simulation=simulation)
    assert not t.shared and why in t.note and "inside Flower's messages" in t.note
    assert "\n" not in t.note


def test_no_store_falls_back_and_says_why(tiny, tmp_path):
    cfg = tiny()
    t = transport.choose(
        cfg,
        {transport.RUN_CONFIG_KEY: "", transport.RUN_CONFIG_NOTE: "OSError: full"},
        simulation=True,
    )
    assert not t.shared and "could not be created (OSError: full)" in t.note
    t = transport.choose(cfg, {transport.RUN_CONFIG_KEY: str(tmp_path)}, simulation=True)
    assert t.shared and str(tmp_path) in t.note


def test_a_failed_write_falls_back_per_message(tmp_path, caplog):
    store = WeightStore(tmp_path / "gone")  # its folder does not exist: every write fails
    t = transport.ServerTransport(store)
    with caplog.at_level(logging.WARNING, logger="fedrcl_flwr"):
        sent = t.send(ARRAYS)
        t.send(ARRAYS)
    assert sent.tensor_type == "numpy.ndarray"
    assert [np.array_equal(a, b) for a, b in zip(transport.arrays_of(sent), ARRAYS)]
    assert sum("weight store write failed" in r.message for r in caplog.records) == 1
    # a client answers by reference when addressed by reference, bytes when that fails
    ok = transport.ServerTransport(WeightStore(tmp_path)).send(ARRAYS)
    assert transport.is_reference(ok) and transport.is_reference(transport.reply(ARRAYS, ok))
    shutil.rmtree(tmp_path)
    assert transport.reply(ARRAYS, ok).tensor_type == "numpy.ndarray"


def test_server_keeps_two_entries_and_releases_uploads(tmp_path):
    from flwr.common import Code, FitRes, Status

    store = WeightStore(tmp_path)
    t = transport.ServerTransport(store)
    refs = [transport.reference_of(t.send([np.full(3, i, np.float32)])) for i in range(3)]
    assert set(store.entries()) == {refs[1]["hash"], refs[2]["hash"]}
    up = transport.reply([np.ones(4, np.float32)], transport._as_parameters(refs[2]))
    t.release([(None, FitRes(Status(Code.OK, ""), up, 1, {}))])
    assert set(store.entries()) == {refs[1]["hash"], refs[2]["hash"]}
    assert t.result(ARRAYS).tensors == []  # Flower's copy of the round's model: nothing


def test_transport_value_is_checked(tmp_path):
    from helpers import tiny_config

    assert tiny_config(tmp_path).simulation.transport == "shared"
    with pytest.raises(ConfigError, match="simulation.transport") as err:
        tiny_config(tmp_path, simulation={"transport": "ray"})
    assert "\n" not in str(err.value)
    assert config_from_dict  # imported for the layering rule (errors from fedrcl_flwr.errors)


def test_every_read_of_a_slot_is_checked_again(tmp_path):
    """A reader's second read of the same reference copies and hashes the slot again (no
    arrays kept from the first read): bytes changed in a live slot after a first good
    read are refused, never used."""
    t, sent = _arena_transport(tmp_path)
    first = transport.arrays_of(sent)
    assert all(np.array_equal(a, b) for a, b in zip(first, ARRAYS))
    ref = transport.reference_of(sent)
    _zero_arrays_of_slot(tmp_path, ref)
    with pytest.raises(StoreError, match="does not hash to its name"):
        transport.arrays_of(sent)
    with pytest.raises(StoreError, match="does not hash to its name"):
        transport.Received(sent).read_into([np.empty_like(a) for a in ARRAYS])
    assert all(np.array_equal(a, b) for a, b in zip(first, ARRAYS))  # a copy of its own


def _zero_arrays_of_slot(root: Path, ref: dict) -> None:
    """Zero every array of the entry in its slot, the header kept."""
    import mmap

    with open(root / "arena", "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        for _, _, offset, nbytes in ref["arrays"]:
            start = ref["offset"] + offset
            mm[start : start + nbytes] = bytes(nbytes)
        mm.close()


def test_the_hash_covers_the_bytes_copied_into_the_model(tmp_path):
    """``read_into`` copies into the given arrays (the model's tensors) and hashes the
    copies: it returns those very arrays, equal to what was sent; arrays of another dtype
    or shape get copies of their own."""
    t, sent = _arena_transport(tmp_path)
    into = [np.empty_like(np.ascontiguousarray(a)) for a in ARRAYS]
    into[1] = np.empty((), np.int32)  # another dtype: a copy of its own instead
    got = transport.Received(sent).read_into(into)
    assert [g is i for g, i in zip(got, into)] == [True, False, True, True, True, True]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, ARRAYS))
    assert got[1].dtype == np.int64 and not got[1].flags.writeable


def test_special_files_in_the_store_are_refused_without_blocking(tmp_path):
    """A FIFO, a symbolic link or a directory where an entry or the arena should be:
    one line (StoreError), at once, never a read that waits for a writer."""
    import os
    import threading

    store = WeightStore(tmp_path)
    ref = store.publish(ARRAYS)
    path = store.path(ref["hash"])
    outcome: list = []

    def read(r):
        try:
            load(r)
        except StoreError as exc:
            outcome.append(str(exc))

    for make, what in (
        (lambda: os.mkfifo(path), "a FIFO"),
        (lambda: os.symlink(tmp_path / "elsewhere", path), "a symbolic link"),
        (lambda: path.mkdir(), "a directory"),
    ):
        (path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink())
        make()
        outcome.clear()
        reader = threading.Thread(target=read, args=(ref,), daemon=True)
        reader.start()
        reader.join(20)
        assert not reader.is_alive(), f"a read of {what} blocked"
        assert len(outcome) == 1 and what in outcome[0] and "\n" not in outcome[0], outcome
    # the arena as a FIFO: a reader refuses it; a writer falls back to a file
    (tmp_path / "a").mkdir()
    t, sent = _arena_transport(tmp_path / "a")
    (tmp_path / "a" / "arena").unlink()
    os.mkfifo(tmp_path / "a" / "arena")
    with pytest.raises(StoreError, match="a FIFO"):
        transport.arrays_of(t.for_client(sent, 1, 0))


# ---------------------------------------------------------------- the arena's slots
def _arena_transport(tmp_path, uploads=2):
    t = transport.ServerTransport(WeightStore(tmp_path), uploads=uploads)
    sent = t.send(ARRAYS)
    assert t.arena is not None and (tmp_path / "arena").is_file()
    return t, sent


def test_sends_and_uploads_go_into_slots_of_one_preallocated_file(tmp_path):
    t, sent = _arena_transport(tmp_path)
    ref = transport.reference_of(sent)
    assert ref["offset"] == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["arena"]
    size = (tmp_path / "arena").stat().st_size
    assert size == t.arena.slot_size * (4 + 2 * 2) and t.arena.slot_size % 4096 == 0
    assert size // 512 <= (tmp_path / "arena").stat().st_blocks  # reserved, not sparse
    # each client of a round is told its slot; its upload goes there, readable as sent
    first, second = t.for_client(sent, 1, 0), t.for_client(sent, 1, 1)
    slots = [transport.reference_of(x)["upload"] for x in (first, second)]
    assert slots[0][0] != slots[1][0] and slots[0][1] == t.arena.slot_size
    ups = [[a * (i + 2) if a.dtype.kind == "f" else a for a in ARRAYS] for i in range(2)]
    replies = [transport.reply(u, x) for u, x in zip(ups, (first, second))]
    offsets = [transport.reference_of(r)["offset"] for r in replies]
    assert offsets == [s[0] for s in slots]
    for up, r in zip(ups, replies):
        assert all(np.array_equal(a, b) for a, b in zip(transport.arrays_of(r), up))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arena"]  # no file per entry
    # the next round's uploads use the other set of slots, the one after it these again
    nxt = transport.reference_of(t.for_client(sent, 2, 0))["upload"][0]
    assert (
        nxt not in offsets
        and transport.reference_of(t.for_client(sent, 3, 0))["upload"][0] == offsets[0]
    )
    # more clients than slots: that client writes a file
    assert t.for_client(sent, 1, 2) is sent
    t.release([])  # nothing to delete in slots
    assert (tmp_path / "arena").exists()


def test_a_slot_written_again_refuses_its_old_reference(tmp_path):
    """The ring of sends: the same model again reuses its live slot; after
    GLOBAL_SLOTS other sends its slot holds another model and the old reference is
    refused with one line (a reader more than a round late), never read as the new one."""
    t, sent = _arena_transport(tmp_path)
    assert t.send(ARRAYS).tensors == sent.tensors  # the live slot, not a new one
    others = [t.send([np.full(3, i, np.float32)]) for i in range(4)]
    assert transport.reference_of(others[-1])["offset"] == 0  # the ring came round
    with pytest.raises(StoreError, match="slot was written again since"):
        transport.arrays_of(sent)
    assert np.array_equal(transport.arrays_of(others[-1])[0], np.full(3, 3, np.float32))


def test_an_upload_too_big_for_its_slot_becomes_a_file(tmp_path, caplog):
    t, sent = _arena_transport(tmp_path)
    big = [np.zeros(t.arena.slot_size, np.uint8)]
    with caplog.at_level(logging.WARNING, logger="fedrcl_flwr"):
        r = transport.reply(big, t.for_client(sent, 1, 0))
    ref = transport.reference_of(r)
    assert "offset" not in ref and (tmp_path / ref["hash"]).is_file()
    assert any("does not fit" in rec.message for rec in caplog.records)
    assert np.array_equal(transport.arrays_of(r)[0], big[0])


def test_no_arena_when_it_would_not_fit_in_memory(tmp_path, monkeypatch):
    """Slots that would take more than half the free space: one file per entry, as
    before, with the reason kept for the log."""
    import os as _os

    real = _os.statvfs

    class Tiny:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 4

    monkeypatch.setattr(_os, "statvfs", lambda p: Tiny(real(p)))
    t = transport.ServerTransport(WeightStore(tmp_path), uploads=2)
    ref = transport.reference_of(t.send(ARRAYS))
    assert t.arena is None and "more than half" in t.arena_note
    assert "offset" not in ref and t.for_client(t.send(ARRAYS), 1, 0).tensors[0]
    assert not (tmp_path / "arena").exists()


def test_a_process_keeps_one_mapping_of_the_arena(tmp_path):
    """Every load of a slot in a process reads through the same mapping (its pages
    fault once), and a new arena at the same path (another run) is mapped afresh."""
    from fedrcl_flwr.weights import mappings

    t, sent = _arena_transport(tmp_path)
    transport.arrays_of(sent)
    first = mappings._MAPS[str(tmp_path / "arena")][1]
    transport.arrays_of(t.send([np.ones(3, np.float32)]))
    assert mappings._MAPS[str(tmp_path / "arena")][1] is first
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    t2, sent2 = _arena_transport(tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(transport.arrays_of(sent2), ARRAYS))
    assert mappings._MAPS[str(tmp_path / "arena")][1] is not first


def test_a_slot_write_hashes_what_it_copies_as_a_reader_does(tmp_path):
    """An entry written into a slot before its hash was known is hashed while it is
    copied, piece by piece (arrays larger than a piece, padding between arrays): the
    reference names the digest a reader computes over the slot, the same as reading the
    arrays gives, and the arrays come back equal; a writable mapping is kept per arena
    and the same writer is reused."""
    from fedrcl_flwr.weights import mappings
    from fedrcl_flwr.weights.entries import PIECE, Entry

    big = np.random.default_rng(0).standard_normal(PIECE // 4 * 3 + 5).astype(np.float32)
    arrays = [*ARRAYS, big, np.arange(7, dtype=np.int16)]
    t = transport.ServerTransport(WeightStore(tmp_path), uploads=2)
    t.send(arrays)  # the arena, its slots sized for these arrays
    fresh = Entry(arrays)
    assert fresh._hash is None  # nothing read yet
    ref = t.store.publish_in_slot(fresh, t.arena.upload_offset(1, 0), t.arena.slot_size)
    assert ref["hash"] == Entry(arrays).hash and ref["size"] == Entry(arrays).size
    assert all(np.array_equal(a, b) for a, b in zip(load(ref), arrays))
    writer = mappings._WRITERS[str(tmp_path / "arena")][1]
    t.store.publish_in_slot(Entry(arrays), t.arena.upload_offset(1, 1), t.arena.slot_size)
    assert mappings._WRITERS[str(tmp_path / "arena")][1] is writer
    with pytest.raises(StoreError, match="does not fit"):
        t.store.publish_in_slot(Entry([big, big]), 0, PIECE)


def test_a_writer_maps_each_region_of_the_arena_once(tmp_path):
    """The first write of a process into the ring (the server's sends) or into the
    upload slots maps that whole region at once, and only then; the bytes written are
    those read back."""
    from fedrcl_flwr.weights import entries, mappings

    t, sent = _arena_transport(tmp_path)
    writer = mappings._WRITERS[str(tmp_path / "arena")][1]
    ring = entries.GLOBAL_SLOTS * t.arena.slot_size
    assert writer.populated == {0}  # the server's first send: the ring only
    up = [a * 3 if a.dtype.kind == "f" else a for a in ARRAYS]
    r = transport.reply(up, t.for_client(sent, 1, 1))
    assert writer.populated == {0, ring}
    transport.reply(up, t.for_client(sent, 2, 0))  # the same region: nothing new
    assert writer.populated == {0, ring}
    assert all(np.array_equal(a, b) for a, b in zip(transport.arrays_of(r), up))


def test_a_killed_processs_store_is_removed_by_the_next_one(tmp_path, monkeypatch):
    """A store whose owners were all killed (no ``finally`` ran) is in ``/dev/shm``, in
    memory: the next store made removes it, and only such a store: one with a live owner,
    one whose PID was reused by a process that started later, one of another PID
    namespace, one without a valid owner record (another tool's, or the old unmarked
    names), one holding a sub-folder, and anything not named as a store stay."""
    import json
    import os
    import subprocess
    import sys

    from fedrcl_flwr.weights import entries, lifecycle

    monkeypatch.setattr(lifecycle, "SHM", tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    ns = lifecycle.pid_namespace()
    assert ns != "0" and ns.isdigit()
    me = [os.getpid(), lifecycle.process_start(os.getpid())]

    def store(name, pids, namespace=ns, marker=True):
        d = tmp_path / f"fedrcl-flwr-store-{name}"
        d.mkdir()
        (d / entries.ARENA).write_bytes(b"x" * 100)
        if marker:
            record = {"pids": pids, "namespace": namespace, "home": ""}
            (d / lifecycle.STORE_MARKER).write_text(json.dumps(record))
        return d

    stale = store("stale", [[dead_pid, 12345]])
    (stale / ".tmp-1-2").write_bytes(b"")
    live = store("live", [[dead_pid, None], me])  # one owner alive
    reused = store("reused", [[os.getpid(), None]])  # start unknown: a live PID keeps it
    elsewhere = store("elsewhere", [[dead_pid, 1]], namespace="1" + ns)
    unmarked = store("unmarked", [[dead_pid, 1]], marker=False)
    nested = store("nested", [[dead_pid, 1]])
    (nested / "sub").mkdir()
    other = tmp_path / f"bench-transport-{dead_pid}"
    other.mkdir()
    later = store("later", [[os.getpid(), me[1] - 1]])  # our PID, started earlier: reused
    made, root = lifecycle.temporary_store()
    try:
        assert root.parent == tmp_path and root.name.startswith(f"fedrcl-flwr-store-{os.getpid()}-")
        assert not stale.exists() and not later.exists()
        for kept in (live, reused, elsewhere, unmarked, nested, other):
            assert kept.is_dir(), kept
        assert lifecycle.remove_stale_stores(tmp_path / "absent") == []
    finally:
        assert lifecycle.remove_store(root)
    assert not root.exists()


# ---------------------------------------------------------------- damage during a run
def _damaging_run(tiny, out: Path, monkeypatch, *, after_first: bool):
    """An in-process run (3 rounds, 3 clients a round, shared transport) in which the
    arrays of the model's ring slot are zeroed (its header kept) during round 2: after
    round 2's first client has read it (``after_first``), or before any client read it.
    Returns the strategy and the damaged reference."""
    from clients import client_class
    from fedrcl_flwr.protocol import FitInstructions

    sent: dict[int, dict] = {}
    real = transport.ServerTransport.for_client

    def for_client(self, send, run_round, index):
        sent.setdefault(run_round, transport.reference_of(send))
        return real(self, send, run_round, index)

    monkeypatch.setattr(transport.ServerTransport, "for_client", for_client)
    cfg = tiny(
        federation={"rounds": 3, "clients_per_round": 3},
        simulation={"transport": "shared"},
        evaluation={"target_rounds": [3]},
    )
    base = client_class(cfg.client.method)
    fits = {"round 2": 0}

    class Damaging(base):  # the harness, not a method: zeroes the slot in round 2
        def train_round(self, parameters, config):
            second = FitInstructions.from_config(config).run_round == 2
            if second and not after_first and fits["round 2"] == 0:
                _zero_arrays_of_slot(Path(sent[2]["store"]), sent[2])
            try:
                return super().train_round(parameters, config)
            finally:
                if second and after_first and fits["round 2"] == 0:
                    _zero_arrays_of_slot(Path(sent[2]["store"]), sent[2])
                fits["round 2"] += second

    state_dir = str(out / "client_state")
    st = run_inprocess(cfg, out, client_factory=lambda: Damaging(cfg, state_dir=state_dir))
    return st, sent[2]


def test_a_slot_damaged_after_a_client_read_it_is_refused_to_every_later_client(
    tiny, tmp_path, monkeypatch
):
    """The model's slot zeroed during round 2 after its first client read it: the round's
    later clients refuse it (they never train on unchecked bytes), the round's record and
    line say so, and the run goes on (round 3 trains every client on a new slot)."""
    from fedrcl_flwr.run.progress import format_round_line

    st, _ = _damaging_run(tiny, tmp_path / "run", monkeypatch, after_first=True)
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2, 3]
    assert recs[1]["failures"] == 2 and recs[1]["num_clients"] == 1, recs[1]
    assert "damaged weight store entry" in recs[1].get("weight_store", ""), recs[1]
    assert "weight store: 2 result(s) lost" in format_round_line(recs[1], 3)
    assert recs[2]["failures"] == 0 and recs[2]["num_clients"] == 3
    assert abs(recs[2]["test_loss"] - np.log(4)) > 1e-3  # not an all-zero model


def test_a_damaged_slot_whose_model_is_sent_again_is_rewritten(tiny, tmp_path, monkeypatch):
    """The model's slot zeroed before round 2's clients read it: every client of round 2
    refuses it (the round fails, its line names the store), the model is unchanged, and
    the server, about to send the same model again, finds the slot damaged and writes it
    into a new one: round 3 trains every client; one damage costs one round."""
    from fedrcl_flwr.run.progress import format_round_line

    st, ref = _damaging_run(tiny, tmp_path / "run", monkeypatch, after_first=False)
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2, 3]
    assert recs[1]["num_clients"] == 0 and recs[1]["failures"] == 3, recs[1]
    line = format_round_line(recs[1], 3)
    assert "ROUND FAILED" in line and "weight store" in line, line
    assert recs[2]["failures"] == 0 and recs[2]["num_clients"] == 3, recs[2]
    assert f"slot at offset {ref['offset']} no longer held the model" in recs[2]["weight_store"]
