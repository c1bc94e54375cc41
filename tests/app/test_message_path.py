"""The cuts in a message's path change no number. Weights on the wire
(``fedrcl_flwr.codec``) against Flower's own encoding, the averaging arithmetic against
its formula, the stored partitions against a fresh computation, the worker cache, the
stage timers, and whole in-process runs with the cuts against the path they replaced."""

import io
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.client import NumPyClient
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from fedrcl_flwr.codec import decode_arrays, encode_array, encode_arrays
from fedrcl_flwr.run import runtime, timers
from fedrcl_flwr.run.results import read_metrics

ARRAYS = [
    np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32),
    np.array(7, dtype=np.int64),
    np.zeros((0, 3)),
    np.arange(12.0).reshape(3, 4).T,
    np.random.default_rng(1).random((2, 3, 4)) > 0.5,
    np.array([1, 2], dtype=">i4"),
    np.float16([1.5, -2.25]),
]


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")} for r in recs]


def test_codec_reads_and_writes_flowers_npy_bytes():
    flower = ndarrays_to_parameters(ARRAYS).tensors
    ours = encode_arrays(ARRAYS)
    for a, mine, theirs in zip(ARRAYS, ours, flower):
        if a.flags.c_contiguous:  # np.save's bytes exactly (F-order: same values)
            assert mine == theirs
        for got in (
            decode_arrays([mine])[0],
            decode_arrays([theirs])[0],
            parameters_to_ndarrays(ndarrays_to_parameters([a]))[0],
        ):
            assert got.dtype == a.dtype and got.shape == a.shape
            assert np.array_equal(got, a)
        back = parameters_to_ndarrays(
            type(ndarrays_to_parameters([]))(tensors=[mine], tensor_type="numpy.ndarray")
        )[0]
        assert np.array_equal(back, a) and back.dtype == a.dtype
    view = decode_arrays(ours)[0]
    assert not view.flags.writeable  # a received message is never written into
    with pytest.raises(ValueError):
        view[0, 0] = 1.0


def test_codec_refuses_what_it_cannot_read_safely():
    with pytest.raises(ValueError, match="object"):
        encode_array(np.array([{"a": 1}], dtype=object))
    pickled = io.BytesIO()  # .npy bytes whose reading would unpickle
    np.save(pickled, np.array([None, 1], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="object"):
        decode_arrays([pickled.getvalue()])
    good = encode_array(np.arange(10, dtype=np.float32))
    with pytest.raises(ValueError, match="do not hold"):
        decode_arrays([good[:-4]])
    with pytest.raises(ValueError, match="not .npy"):
        decode_arrays([b"garbage" * 20])


def test_weighted_average_is_the_formula_bit_for_bit():
    """The buffered product is the same IEEE arithmetic as ``c * w.astype(float64)``."""
    from fedrcl_flwr.server.aggregation import client_coefficients, weighted_average

    rng = np.random.default_rng(5)
    clients = [
        [
            rng.normal(size=(17, 5)).astype(np.float32),
            rng.normal(size=9).astype(np.float16),
            np.array(i, dtype=np.int64),
            rng.normal(size=300),
        ]  # float64: any change of order or rounding shows
        for i in range(7)
    ]
    kinds = ["param", "buffer", "count", "param"]
    for weighting, n in (("uniform", [1] * 7), ("samples", [3, 50, 7, 11, 2, 9, 30])):
        coefs = client_coefficients(n, weighting)
        got = weighted_average(clients, coefs, kinds)
        for j in (0, 1, 3):  # the formula written out, entry by entry
            acc = np.zeros(clients[0][j].shape, dtype=np.float64)
            for c, cw in zip(coefs, clients):
                acc += c * cw[j].astype(np.float64)
            want = acc.astype(clients[0][j].dtype)
            assert got[j].dtype == want.dtype and np.array_equal(got[j], want)
        assert got[2] == 6


def test_partitions_are_stored_beside_the_dataset_and_read_back(tiny, tmp_path, monkeypatch):
    from fedrcl_flwr.data import partition
    from fedrcl_flwr.data.cache import splits
    from fedrcl_flwr.data.cache.ownership import is_own_entry

    cfg = tiny(federation={"num_clients": 20})
    runtime.WORKER.clear()
    calls = []
    real = partition.partition
    monkeypatch.setattr(partition, "partition", lambda *a, **k: calls.append(1) or real(*a, **k))
    try:
        # the entry is shared with other tests' splits of the same data: take this one's
        entry = runtime._dataset(cfg)[1]
        before = set(entry.glob("split-*.npz"))
        first = runtime.client_partitions(cfg)
        stored = sorted(set(entry.glob("split-*.npz")) - before)
        assert calls and len(stored) == 1 and is_own_entry(entry)  # cleared with it
        runtime.WORKER.clear()
        calls.clear()
        again = runtime.client_partitions(cfg)  # a new process: read, not drawn
        assert not calls
        assert len(again) == len(first) == 20
        assert all(
            a.dtype == b.dtype == np.int64 and np.array_equal(a, b) for a, b in zip(first, again)
        )
        # a damaged file is recomputed (same arrays), never used
        raw = bytearray(stored[-1].read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        stored[-1].write_bytes(bytes(raw))
        runtime.WORKER.clear()
        fixed = runtime.client_partitions(cfg)
        assert calls and all(np.array_equal(a, b) for a, b in zip(first, fixed))
        # other partition code (or torch / NumPy) is another key: drawn again
        runtime.WORKER.clear()
        calls.clear()
        monkeypatch.setattr(splits, "_partition_code", lambda: ["other code"])
        runtime.client_partitions(cfg)
        assert calls
    finally:
        runtime.WORKER.clear()


def test_worker_cache_is_one_object_with_clear(tiny, tmp_path):
    from fedrcl_flwr.app.common import config_from_run_config

    cfg = tiny()
    runtime.WORKER.clear()
    runtime.load_bundle(cfg)
    runtime.client_partitions(cfg)
    runtime.set_node_name("node-a")
    assert runtime.WORKER.datasets and runtime.WORKER.partitions
    assert runtime.node_name() == "node-a"
    runtime.WORKER.clear_datasets()
    assert not runtime.WORKER.datasets and runtime.node_name() == "node-a"
    runtime.WORKER.clear()
    assert runtime.WORKER.node is None and not runtime.WORKER.partitions
    # the experiment of a run config is parsed once per file content
    from fedrcl_flwr.config import dump_config

    path = tmp_path / "exp.yaml"
    dump_config(cfg, path)
    a = config_from_run_config({"experiment": str(path)})
    assert config_from_run_config({"experiment": str(path)}) is a
    cfg.federation.rounds = 9
    dump_config(cfg, path)
    b = config_from_run_config({"experiment": str(path)})
    assert b is not a and b.federation.rounds == 9
    runtime.WORKER.clear()


def _old_path(monkeypatch):
    """The message path before the cuts: Flower's NumPyClient wrapper (its encoding),
    Flower's decoding on the server, the unbuffered averaging formula, every process
    drawing its own partitions."""
    import strategies.averaging as averaging
    import strategies.screening as screening
    from clients.base import FederatedClient
    from fedrcl_flwr.app.wire import transport
    from fedrcl_flwr.data.cache import splits

    def average(client_weights, coefficients, kinds, dtype="float64"):
        assert dtype == "float64"  # the formula before the cuts
        out = []
        for j, kind in enumerate(kinds):
            arrays = [np.asarray(cw[j]) for cw in client_weights]
            if kind == "count":
                out.append(np.max(np.stack(arrays), axis=0).astype(arrays[0].dtype))
                continue
            acc = np.zeros(arrays[0].shape, dtype=np.float64)
            for c, a in zip(coefficients, arrays):
                acc += c * a.astype(np.float64)
            out.append(acc.astype(arrays[0].dtype))
        return out

    monkeypatch.setattr(FederatedClient, "to_client", NumPyClient.to_client)
    # weights inside the messages as Flower's own functions write them (the run's
    # simulation.transport is flower: fedrcl_flwr/app/wire/transport.py sends bytes)
    monkeypatch.setattr(transport, "to_bytes", ndarrays_to_parameters)
    monkeypatch.setattr(
        screening,
        "open_upload",
        lambda params: (
            parameters_to_ndarrays(
                type(ndarrays_to_parameters([]))(
                    tensors=params.tensors, tensor_type="numpy.ndarray"
                )
            ),
            None,
        ),
    )
    monkeypatch.setattr(averaging, "weighted_average", average)
    # the screen's NaN/Inf check on each upload, then the formula
    monkeypatch.setattr(
        averaging,
        "average_and_screen",
        lambda w, c, k, take=None, workers=1, dtype="float64": (average(w, c, k, dtype), False),
    )
    monkeypatch.setattr(splits, "load_partition", lambda entry, s, n, compute: compute())


@pytest.mark.parametrize("method,strategy", [("fedprox", "fedadam"), ("feddyn", "feddyn")])
def test_cuts_leave_a_run_bit_identical(tiny, tmp_path, monkeypatch, method, strategy):
    """A run through the new path (weights by reference to the store, buffered average,
    stored partitions, a fresh worker cache) equals, number for number, the same run
    through the path it replaced (Flower's encoding inside the messages); the methods
    read the received weights (FedProx's proximal term, FedDyn's anchors)."""
    from fedrcl_flwr.app.inprocess import run_inprocess

    cfg = tiny(
        client={"method": method},
        server={"strategy": strategy},
        federation={"rounds": 2, "clients_per_round": 2},
    )
    runtime.client_partitions(cfg)  # stored: the run below reads them
    runtime.WORKER.clear()
    run_inprocess(cfg, tmp_path / "new", overlap_evaluation=True)
    runtime.WORKER.clear()
    assert cfg.simulation.transport == "shared"
    with monkeypatch.context() as m:
        _old_path(m)
        cfg.simulation.transport = "flower"
        run_inprocess(cfg, tmp_path / "old")
    runtime.WORKER.clear()
    new, old = read_metrics(tmp_path / "new"), read_metrics(tmp_path / "old")
    assert len(new) == 2 and _strip(new) == _strip(old)


def test_timers_record_every_stage_and_change_nothing(tiny, tmp_path, monkeypatch):
    """Through the real ClientApp (its mods, Flower's message handling) on the in-process
    grid: with ``FEDRCL_TIMERS`` set every client message leaves one record with its
    stages, and the run's numbers equal those of an untimed run."""
    from fedrcl_flwr.app.inprocess import run_workflow_inprocess

    cfg = tiny(federation={"rounds": 2})
    run_workflow_inprocess(cfg, tmp_path / "plain")
    monkeypatch.setattr(timers, "_DIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    run_workflow_inprocess(cfg, tmp_path / "timed")
    assert _strip(read_metrics(tmp_path / "plain")) == _strip(read_metrics(tmp_path / "timed"))
    clients, server = timers.read_records(tmp_path / "t")
    assert len(clients) == 2 * 2
    for rec in clients:
        assert rec["t_enter"] <= rec["t_fit"] <= rec["t_fit_end"] <= rec["t_exit"]
        assert set(rec["stages"]) == {"construct", "data", "load", "train", "encode"}
        assert rec["created_at"] <= rec["t_enter"] and rec["round"] in (1, 2)
    events = {(e["event"], e["round"]) for e in server}
    assert {("configure", 1), ("sent", 1), ("results", 1), ("round_end_end", 2)} <= events


def test_timers_off_open_nothing(monkeypatch):
    """Without ``FEDRCL_TIMERS`` a timer is one test of a constant: no record is opened,
    every stage is the same no-op context."""
    monkeypatch.setattr(timers, "_DIR", None)
    monkeypatch.setattr(timers._local, "record", None, raising=False)
    assert not timers.enabled()
    timers.begin(x=1)
    timers.note(y=2)
    assert timers._local.record is None
    assert timers.stage("train") is timers.stage("load") is timers._OFF
    timers.end()


def test_supernodes_default_to_the_clients_per_round(tiny):
    from fedrcl_flwr.runner import federation_config

    cfg = tiny(federation={"num_clients": 400, "clients_per_round": None, "participation": 0.05})
    assert cfg.supernodes() == 20
    assert "num-supernodes=20 " in federation_config(cfg)
    cfg.simulation.num_supernodes = 200
    assert cfg.supernodes() == 200


class _FakeGrid:
    """push_messages gives ids; a reply for an id exists once ``answer(id)`` ran;
    pull_messages returns (and consumes) the replies of the ids asked for."""

    def __init__(self, fail=False):
        import itertools
        import threading

        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.ready: dict[str, object] = {}
        self.pulls: list[list[str]] = []
        self.fail = fail

    def push_messages(self, messages):
        return [f"m{next(self._ids)}" for _ in messages]

    def answer(self, mid):
        from types import SimpleNamespace

        with self._lock:
            self.ready[mid] = SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid))

    def pull_messages(self, ids):
        if self.fail:
            raise RuntimeError("the SuperLink went away")
        with self._lock:
            self.pulls.append(sorted(ids))
            return [self.ready.pop(i) for i in list(ids) if i in self.ready]


def test_one_thread_collects_the_replies_of_every_waiting_client(monkeypatch):
    """Legacy loop: one thread per client calls send_and_receive([message]); the
    collector asks the grid for all of them in one pull per interval and hands each
    reply to its caller."""
    import threading

    from fedrcl_flwr.app import replies

    fake = _FakeGrid()
    grid = replies.ReplyCollector(fake, interval=0.005)
    got: dict[int, list] = {}
    threads = [
        threading.Thread(target=lambda k=k: got.update({k: grid.send_and_receive([k])}))
        for k in range(8)
    ]
    for th in threads:
        th.start()
    deadline = time.time() + 60
    while len({i for p in fake.pulls for i in p}) < 8 and time.time() < deadline:
        time.sleep(0.005)
    assert max(len(p) for p in fake.pulls) == 8  # one look-up for all eight
    for k in range(8):
        fake.answer(f"m{k}")
    for th in threads:
        th.join(60)
    mids = sorted(r[0].metadata.reply_to_message_id for r in got.values())
    assert len(got) == 8 and mids == sorted(f"m{k}" for k in range(8))
    # a timeout returns what came, and leaves the late reply to the grid
    t0 = time.time()
    assert grid.send_and_receive(["late"], timeout=0.05) == []
    assert 0.04 <= time.time() - t0 and not grid._waiters
    # nothing waited for: the thread ends
    monkeypatch.setattr(replies, "IDLE_EXIT", 0.01)
    grid2 = replies.ReplyCollector(_FakeGrid(), interval=0.005)
    assert grid2.send_and_receive([1], timeout=0.02) == []
    deadline = time.time() + 60
    while grid2._thread is not None and time.time() < deadline:
        time.sleep(0.01)
    assert grid2._thread is None


def test_a_grid_failure_reaches_every_waiting_caller():
    from fedrcl_flwr.app.replies import ReplyCollector

    grid = ReplyCollector(_FakeGrid(fail=True), interval=0.005)
    with pytest.raises(RuntimeError, match="SuperLink went away"):
        grid.send_and_receive([1, 2])


def test_client_manager_waits_for_late_nodes():
    from flwr.server.client_proxy import ClientProxy

    from fedrcl_flwr.app.server_app import EagerClientManager

    class Proxy(ClientProxy):
        def get_properties(self, *a, **k): ...
        def get_parameters(self, *a, **k): ...
        def fit(self, *a, **k): ...
        def evaluate(self, *a, **k): ...
        def reconnect(self, *a, **k): ...

    cm = EagerClientManager()
    threading.Timer(0.2, lambda: [cm.register(Proxy(str(i))) for i in range(3)]).start()
    t0 = time.monotonic()
    assert cm.wait_for(3, timeout=10)
    assert time.monotonic() - t0 < 2.0  # Flower's refresh thread would take up to 5 s
    assert not cm.wait_for(4, timeout=0.2)


def test_records_are_json_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(timers, "_DIR", str(tmp_path))
    timers.begin(node=1)
    with timers.stage("train"):
        time.sleep(0.01)
    timers.mark("t_fit")
    timers.end()
    timers.server_event("sent", round=1)
    (tmp_path / "client-999.jsonl").write_text('{"torn": ')  # a killed writer's last line
    clients, server = timers.read_records(tmp_path)
    assert len(clients) == 1 and clients[0]["stages"]["train"] >= 0.01
    assert server == [json.loads((next(tmp_path.glob("server-*.jsonl"))).read_text())]


def test_defaults_are_one_single_threaded_actor_per_core(tiny, tmp_path):
    """Ray sizes Flower's actor pool as its CPUs / ``client-resources-num-cpus``: with the
    default 1 CPU per client and no cap, one actor per core on any machine; each message
    runs with one torch thread (threads per actor beyond the CPUs it holds
    only fight the other actors)."""
    import torch
    from flwr.common import Context, RecordDict

    from fedrcl_flwr.app.client_app import client_fn
    from fedrcl_flwr.config import dump_config
    from fedrcl_flwr.runner import federation_config

    cfg = tiny()
    fed = federation_config(cfg).split()
    assert "client-resources-num-cpus=1" in fed
    assert not any(item.startswith("init-args-num-cpus") for item in fed)
    dump_config(cfg, tmp_path / "exp.yaml")
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0},
        state=RecordDict(),
        run_config={"experiment": str(tmp_path / "exp.yaml"), "output-dir": str(tmp_path / "out")},
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        client_fn(ctx)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        runtime.WORKER.clear()


def test_ray_workers_import_the_client_app_as_they_start(monkeypatch):
    """The simulation's SuperLink environment names Ray's runtime-env hook, which
    adds the setup hook that imports the ClientApp in every worker (a hook of the user's
    is kept, and so is Flower's own runtime env); the hook resolves and imports the
    ClientApp module."""
    import importlib
    import sys

    import ray._private.ray_constants as ray_constants

    from fedrcl_flwr.app import worker_warmup
    from fedrcl_flwr.launch.processes import procs_with
    from fedrcl_flwr.launch.superlink import LocalSuperLink

    monkeypatch.delenv("RAY_RUNTIME_ENV_HOOK", raising=False)
    link = LocalSuperLink(log_path=None)  # (its watchdog starts now: stopped below)
    cluster = LocalSuperLink(log_path=None, ray_address="10.0.0.1:6379")
    link.stop()
    cluster.stop()
    assert not link.home.exists() and not cluster.home.exists()
    assert not procs_with(str(link.home)) and not procs_with(str(cluster.home))  # no watchdog left
    hook = link.env[ray_constants.RAY_RUNTIME_ENV_HOOK]
    # a cluster's workers are started the cluster's way (no hook of ours)
    assert ray_constants.RAY_RUNTIME_ENV_HOOK not in cluster.env
    module, _, name = hook.rpartition(".")
    add = getattr(importlib.import_module(module), name)
    flowers = {"env_vars": {"PYTHONPATH": "/x"}}
    env = add(flowers)
    assert env == {
        "env_vars": {"PYTHONPATH": "/x"},
        "worker_process_setup_hook": worker_warmup.SETUP_HOOK,
    }
    assert flowers == {"env_vars": {"PYTHONPATH": "/x"}}  # not modified in place
    assert (
        add({"worker_process_setup_hook": "mine.hook"})["worker_process_setup_hook"] == "mine.hook"
    )
    assert add(None) == {"worker_process_setup_hook": worker_warmup.SETUP_HOOK}
    module, _, name = worker_warmup.SETUP_HOOK.rpartition(".")
    getattr(importlib.import_module(module), name)()  # what Ray calls in a new worker
    assert "fedrcl_flwr.app.client_app" in sys.modules and "torch._dynamo" in sys.modules


def test_a_private_ray_keeps_its_session_files_in_the_run_home(monkeypatch, tmp_path):
    """Ray's default session directory (``$TMPDIR/ray``) kept every run's logs and sockets
    forever: a private Ray gets ``RAY_TMPDIR`` = the run's home (deleted at teardown) when
    its socket paths fit in an AF_UNIX address (107 bytes), and ``flower.log`` says where
    they are in either case; a cluster's Ray is left alone. (With the files in the home:
    the SIGKILL run of ``tests/e2e/test_process_teardown.py``.)"""
    import tempfile

    from fedrcl_flwr.launch import superlink

    monkeypatch.setenv("RAY_TMPDIR", "/somewhere/else")
    short = tmp_path / "short"
    short.mkdir()
    fit = superlink.AF_UNIX_PATH_MAX - superlink.RAY_SOCKET_TAIL - superlink._pid_digits()
    assert superlink.ray_sockets_fit(Path("/" + "h" * (fit - 1)))
    assert not superlink.ray_sockets_fit(Path("/" + "h" * fit))
    # a real session's socket path at the limit, as Ray builds it
    session = "session_2026-11-28_07-22-05_619201_" + "9" * superlink._pid_digits()
    longest = "/" + "h" * (fit - 1) + f"/ray/{session}/sockets/plasma_store"
    assert len(longest) == superlink.AF_UNIX_PATH_MAX

    links = []
    try:
        # a short home (/tmp/fedrcl-flwr-home-XXXXXXXX), then one too long
        monkeypatch.setattr(tempfile, "tempdir", "/tmp")
        links.append(superlink.LocalSuperLink(log_path=tmp_path / "a.log"))
        (tmp_path / ("d" * 80)).mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("d" * 80)))
        links.append(superlink.LocalSuperLink(log_path=tmp_path / "b.log"))
        links.append(
            superlink.LocalSuperLink(log_path=tmp_path / "c.log", ray_address="10.0.0.1:6379")
        )
    finally:
        for link in links:
            link.stop()
    home, long_home, cluster = links
    assert home.env["RAY_TMPDIR"] == str(home.home)
    # otherwise the user's choice (here RAY_TMPDIR), as without this tool
    assert long_home.env["RAY_TMPDIR"] == cluster.env["RAY_TMPDIR"] == "/somewhere/else"
    assert superlink.ray_session_note(home.env, home.home) == (
        f"Ray's session files: {home.home}/ray (removed with the run)"
    )
    note = superlink.ray_session_note(long_home.env, long_home.home)
    assert note.startswith("Ray's session files: /somewhere/else/ray, kept after the run")
    assert "$TMPDIR/ray or /tmp/ray, kept" in superlink.ray_session_note({}, long_home.home)
    assert (
        superlink.ray_session_note(cluster.env, cluster.home)
        == "Ray: joining the cluster at 10.0.0.1:6379"
    )
    assert not any(link.home.exists() for link in links)


def test_process_start_time_is_when_the_process_started(tmp_path):
    """``timers.process_start_time`` (the start-up breakdown's "process start"): a child
    reports a start between its spawn and its report, not its import time."""
    import subprocess
    import sys
    import time

    code = (
        "import time; time.sleep(0.5); "
        "from fedrcl_flwr.run import timers; print(timers.process_start_time(), time.time())"
    )
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    started, reported = map(float, out.stdout.split())
    assert started >= before - 0.05  # not before the spawn (10 ms clock ticks)
    assert reported - started >= 0.5 - 0.05  # before the child's sleep, not at the import


def test_startup_marks_split_the_start_up_into_segments_that_add_up():
    """``bench_regimes.startup_marks``: the run's start-up events (CLI launch, SuperLink
    launch, ServerApp process start / module imported / called / built, round 1's
    configure) in order; later rounds' and a resumed run's second events are ignored;
    the segments chain, so they add up to the whole start-up."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_regimes

    events = [
        {"event": "superlink_launch", "t": 101.5},
        {"event": "serverapp_start", "t": 106.0, "process_start": 103.0, "imported": 105.9},
        {"event": "serverapp_built", "t": 106.3},
        {"event": "configure", "t": 106.4, "round": 1},
        {"event": "sent", "t": 106.5, "round": 1, "clients": 5},
        {"event": "configure", "t": 110.0, "round": 2},
        {"event": "serverapp_start", "t": 200.0, "process_start": 199.0, "imported": 199.5},
    ]
    marks = bench_regimes.startup_marks(events, 100.0)
    assert marks == {
        "launch": 100.0,
        "superlink": 101.5,
        "process": 103.0,
        "imported": 105.9,
        "called": 106.0,
        "built": 106.3,
        "round1": 106.4,
    }
    segs = bench_regimes.STARTUP_SEGMENTS
    assert segs[0][1] == "launch" and segs[-1][2] == "round1"
    assert all(a[2] == b[1] for a, b in zip(segs, segs[1:]))  # chained: they add up
    assert bench_regimes.startup_marks([], 5.0) == {"launch": 5.0}  # timers off: nothing


def test_methods_without_signals_do_not_import_the_signal_exchange():
    """The ServerApp of a method that exchanges no signals leaves the signal exchange (and
    the SciPy its clustering imports: 0.3 s of every run's start-up) unimported; a method
    that exchanges signals gets its exchange."""
    import subprocess
    import sys

    code = """
import sys
from fedrcl_flwr.app.server_app import make_exchange
from fedrcl_flwr.config import config_from_dict
plain = config_from_dict({"client": {"method": "fedavg"}}, "test")
assert make_exchange(plain, 10) is None
assert "fedrcl_flwr.server.signal_exchange" not in sys.modules, "imported for fedavg"
assert "scipy" not in sys.modules, "SciPy imported for fedavg"
fpl = config_from_dict({"client": {"method": "fpl"}}, "test")
assert type(make_exchange(fpl, 10)).__name__ == "SignalExchange"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_collector_hands_anything_else_to_the_grid():
    from fedrcl_flwr.app.replies import ReplyCollector

    fake = _FakeGrid()
    fake.pull_interval = 0.1
    grid = ReplyCollector(fake)
    assert grid.pull_interval == 0.1 and grid.push_messages([1, 2]) == ["m0", "m1"]
    with pytest.raises(AttributeError):
        grid.no_such_attribute  # noqa: B018 - the lookup is the test


def test_the_cli_imports_flowers_run_command_while_the_superlink_starts(monkeypatch):
    """The runner imports ``flwr run``'s modules in a thread while it waits for the
    SuperLink (``runner._import_flower_cli``); an import failure there is left for the
    real call to report, with its context."""
    import subprocess
    import sys

    from fedrcl_flwr import runner
    from fedrcl_flwr.app.wire import flower_private

    code = (
        "import sys; from fedrcl_flwr import runner\n"
        "assert 'flwr.cli.run.run' not in sys.modules\n"
        "runner._import_flower_cli()\n"
        "print('flwr.cli.run.run' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stdout + out.stderr

    def broken():
        raise ImportError("no flwr.cli here")

    monkeypatch.setattr(flower_private, "cli_run", broken)
    assert runner._import_flower_cli() is None


def test_bench_regimes_counts_each_kind_of_a_runs_processes():
    """``bench_regimes``' CPU accounting: each process of a run named by its command line
    (the in-process runner's code, which names the CLI module, is the in-process runner;
    an unknown command is "other"), the line sorted by CPU with its total, and the
    benchmark's own process known as such."""
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_regimes

    kind = bench_regimes.kind_of_command
    py = "/usr/bin/python3.11"
    assert kind(f"{py} /x/ray/_private/workers/default_worker.py --node-ip") == (
        "Ray workers (actors)"
    )
    assert kind(f"{py} /x/bin/flwr-simulation --runtime-api-address 1") == "simulation process"
    assert kind(f"{py} /x/bin/flower-superlink --simulation") == "SuperLink"
    assert kind("/x/ray/core/src/ray/raylet/raylet --node-ip") == "Ray's node"
    assert kind(f"{py} -m fedrcl_flwr.launch.processes watch /tmp/h") == "watchdog"
    assert kind(f"{py} -m fedrcl_flwr.cli run q.yaml") == "CLI"
    assert kind(f"{py} -c {bench_regimes.INPROCESS} q.yaml") == "in-process runner"
    assert kind("/bin/sh -c true") == "other"
    assert bench_regimes.process_kind(str(os.getpid())) == "benchmark"
    line = bench_regimes.cpu_line({"wall": 10.0, "cpu": {"SuperLink": 1.25, "CLI": 2.5}})
    assert line.split("CPU", 1)[1] == "   3.8 s over 10.0 s: CLI 2.5, SuperLink 1.2"
    assert bench_regimes.cpu_line({"wall": 1.0, "cpu": {}}) == ""


# ------------------------------------------------ the simulation engine's doorbell
def _fake_engine_module(monkeypatch, add_messages_to_queue=None, run_api=None):
    """A stand-in for Flower's ``vce_api`` in ``sys.modules``: its ``run_api`` reads
    ``add_messages_to_queue`` by name, as Flower's does."""
    import sys
    import types

    from fedrcl_flwr.app.wire import flower_private

    module = types.ModuleType(flower_private.ENGINE_MODULE)

    def flowers_lookup(state, queue, nodes_mapping, f_stop):
        while not f_stop.is_set():
            f_stop.wait(0.1)

    def flowers_run_api(app_fn, backend_fn, nodes_mapping, state_factory, stores, f_stop):
        return module.add_messages_to_queue  # the global, read when run_api runs

    module.add_messages_to_queue = add_messages_to_queue or flowers_lookup
    module.run_api = run_api or flowers_run_api
    monkeypatch.setitem(sys.modules, flower_private.ENGINE_MODULE, module)
    return module


def test_the_engine_doorbell_replaces_flowers_look_up_only_where_it_can(monkeypatch):
    import sys
    import threading

    from fedrcl_flwr.app.wire import flower_private

    # not a simulation process: Flower's look-up is kept, and the log says why
    monkeypatch.delitem(sys.modules, flower_private.ENGINE_MODULE, raising=False)
    bell = flower_private._install_doorbell()
    assert not bell.installed and "not a Flower simulation process" in bell.note

    # the engine's module as Flower 1.42 has it: replaced, and run_api starts ours
    module = _fake_engine_module(monkeypatch)
    original = module.add_messages_to_queue
    bell = flower_private._install_doorbell()
    assert bell.installed and "picks up messages when the ServerApp sends them" in bell.note
    assert module.add_messages_to_queue is not original
    assert module.run_api(None, None, {}, None, {}, None) is module.add_messages_to_queue

    # a later Flower whose look-up has another shape: kept, the change named
    def other_shape(state, queue, nodes_mapping, stop_event):
        pass

    _fake_engine_module(monkeypatch, add_messages_to_queue=other_shape)
    bell = flower_private._install_doorbell()
    assert not bell.installed and "no parameter(s) ['f_stop']" in bell.note

    # a run_api that holds the function itself instead of reading the module's: kept
    def binds_early(app_fn, backend_fn, nodes_mapping, state_factory, stores, f_stop):
        return app_fn

    _fake_engine_module(monkeypatch, run_api=binds_early)
    bell = flower_private._install_doorbell()
    assert not bell.installed and "does not read the module's add_messages_to_queue" in bell.note

    # the engine's thread already runs Flower's look-up: replacing the module's function
    # would change nothing, and the log says so
    module = _fake_engine_module(monkeypatch)
    stop = threading.Event()
    engine = threading.Thread(target=module.add_messages_to_queue, args=(None, None, {}, stop))
    engine.start()
    try:
        bell = flower_private._install_doorbell()
        assert not bell.installed and "its thread had started before the ServerApp" in bell.note
    finally:
        stop.set()
        engine.join(10)


def test_a_ring_makes_the_engine_look_up_at_once(monkeypatch):
    """The replaced look-up makes Flower's passes (one ``get_message_ins(node, limit=1)``
    per node); between passes it waits for the doorbell. With the interval set to 10
    minutes here, a message sent after a pass reaches the engine's queue only because the
    ServerApp rang."""
    import queue
    import threading

    from fedrcl_flwr.app.wire import flower_private

    monkeypatch.setattr(flower_private, "LOOKUP_INTERVAL", 600.0)

    class State:
        def __init__(self):
            self.pending: dict[int, list[str]] = {7: ["a", "b"], 9: []}
            self.lock = threading.Lock()
            self.calls: list[tuple[int, int]] = []
            self.passed = threading.Event()

        def get_message_ins(self, node_id, limit):
            with self.lock:
                self.calls.append((node_id, limit))
                out, self.pending[node_id] = (
                    self.pending[node_id][:limit],
                    self.pending[node_id][limit:],
                )
            if node_id == 9:
                self.passed.set()
            return out

    event = threading.Event()
    lookup = flower_private._lookup_on_ring(event)
    state, inbox, stop = State(), queue.Queue(), threading.Event()
    engine = threading.Thread(target=lookup, args=(state, inbox, {7: 0, 9: 1}, stop))
    engine.start()
    try:
        assert inbox.get(timeout=60) == "a"  # the first pass: one message per node
        assert state.passed.wait(60)
        assert inbox.empty()  # "b" waits for the next pass
        state.passed.clear()
        with state.lock:
            state.pending[9].append("c")
        flower_private.EngineDoorbell(True, "", event).ring()
        got = {inbox.get(timeout=60), inbox.get(timeout=60)}
        assert got == {"b", "c"}
        assert state.calls[:2] == [(7, 1), (9, 1)]
    finally:
        stop.set()
        event.set()
        engine.join(60)
    assert not engine.is_alive()


def test_the_collector_rings_after_every_send():
    from fedrcl_flwr.app.replies import ReplyCollector

    rings: list[int] = []
    fake = _FakeGrid()
    grid = ReplyCollector(fake, interval=0.005, on_send=lambda: rings.append(len(rings)))
    grid.push_messages([1, 2])
    assert rings == [0]
    assert grid.send_and_receive([3], timeout=0.01) == []
    assert rings == [0, 1]


def test_each_actor_is_given_its_next_message_while_it_runs_one(monkeypatch):
    """``two_messages_per_actor``: after Flower's ``build`` every actor is in the pool
    twice (two of Flower's worker threads serve it, ``num_workers`` counts both), and
    ``terminate`` stops each actor once."""
    import sys
    import types

    from fedrcl_flwr.app.wire import flower_private

    flower_private.load("flwr.simulation.ray_transport.ray_actor:BasicActorPool")  # real

    class Pool:
        def __init__(self, actors):
            self.pool, self.num_actors, self.terminated = list(actors), len(actors), []

        def terminate_all_actors(self):
            self.terminated.extend(self.pool)

    class RayBackend:
        def __init__(self):
            self.pool = None

        def build(self, app_fn):
            self.pool = Pool(["actor0", "actor1"])

        def terminate(self):
            self.pool.terminate_all_actors()

        def process_message(self, message, context):
            raise NotImplementedError

        @property
        def num_workers(self):
            return self.pool.num_actors

    def run_api(app_fn, backend_fn, nodes_mapping, state_factory, stores, f_stop):
        backend = backend_fn()
        return [add_messages_to_queue for _ in range(backend.num_workers)]

    add_messages_to_queue = None
    engine = types.ModuleType(flower_private.ENGINE_MODULE)
    engine.run_api = run_api
    backend_module = types.ModuleType(flower_private.BACKEND_MODULE)
    backend_module.RayBackend = RayBackend

    # not a simulation process: Flower's pool is kept
    monkeypatch.delitem(sys.modules, flower_private.ENGINE_MODULE, raising=False)
    patch = flower_private._install_two_per_actor()
    assert not patch.installed and "not a Flower simulation process" in patch.note

    monkeypatch.setitem(sys.modules, flower_private.ENGINE_MODULE, engine)
    monkeypatch.setitem(sys.modules, flower_private.BACKEND_MODULE, backend_module)
    # Ray already up in this process: the pool may be built, Flower's is kept
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    patch = flower_private._install_two_per_actor()
    assert not patch.installed and "Ray had started before the ServerApp" in patch.note
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))

    patch = flower_private._install_two_per_actor()
    assert patch.installed and "given its next message while it runs one" in patch.note
    backend = RayBackend()
    backend.build(app_fn=None)
    assert sorted(backend.pool.pool) == ["actor0", "actor0", "actor1", "actor1"]
    assert isinstance(backend.pool.pool, flower_private.LeastBusyFirst)
    assert backend.num_workers == 4  # run_api starts a worker thread per entry
    # Flower's submit pops an idle entry, add_actor_back_to_pool appends it: each message
    # goes to the actor with the fewest in flight
    entries = backend.pool.pool
    first = [entries.pop(), entries.pop()]
    assert sorted(first) == ["actor0", "actor1"]  # one each before any gets two
    entries.append(first[0])  # its message is done: that actor has none in flight now
    assert entries.pop() == first[0]
    pool = backend.pool
    backend.terminate()
    assert pool.terminated == ["actor0", "actor1"]

    # a later Flower whose backend has no `build`: kept, the change named
    class Renamed:
        terminate = process_message = num_workers = None

    backend_module.RayBackend = Renamed
    patch = flower_private._install_two_per_actor()
    assert not patch.installed and "no attribute(s) ['build']" in patch.note
    # a run_api that no longer starts a worker per backend.num_workers: kept
    backend_module.RayBackend = RayBackend
    engine.run_api = lambda app_fn, backend_fn: None
    patch = flower_private._install_two_per_actor()
    assert not patch.installed and "does not start a worker per backend.num_workers" in patch.note


def test_an_idle_actor_is_never_passed_over():
    """With fewer messages than pool entries (5 clients a round on 5 actors, two entries
    each), whatever order the entries came back in, each message goes to an idle actor;
    and Flower's worker threads popping and appending at once lose no entry."""
    import random
    import threading

    from fedrcl_flwr.app.wire.flower_private import LeastBusyFirst

    actors = [f"actor{i}" for i in range(5)]
    rng = random.Random(0)
    for _ in range(50):
        order = actors * 2
        rng.shuffle(order)  # the order the last round's entries were returned in
        entries = LeastBusyFirst(order)
        taken = [entries.pop() for _ in range(5)]
        assert sorted(taken) == actors, order
        taken += [entries.pop() for _ in range(5)]
        assert sorted(taken) == sorted(actors * 2) and not entries

    entries = LeastBusyFirst(actors * 2)
    errors: list[BaseException] = []

    def worker():
        try:
            for _ in range(2000):
                entry = entries.pop()
                entries.append(entry)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and sorted(entries) == sorted(actors * 2)
