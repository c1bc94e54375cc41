"""FedAvg aggregation arithmetic and the strategy's round mechanics, in process."""

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from helpers import FakeManager, FakeProxy, fitres
from helpers import make_strategy as make

from fedrcl_flwr.run.runtime import sample_partitions
from fedrcl_flwr.server.aggregation import client_coefficients, entry_kinds, weighted_average
from strategies.round_records import AllClientsFailed


def test_uniform_and_weighted_average_by_hand():
    w1 = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    w2 = [np.array([3.0, 6.0], np.float32), np.array([[4.0]], np.float32)]
    kinds = ["param", "param"]
    u = weighted_average([w1, w2], client_coefficients([10, 30], "uniform"), kinds)
    np.testing.assert_allclose(u[0], [2.0, 4.0])
    np.testing.assert_allclose(u[1], [[2.0]])
    s = weighted_average([w1, w2], client_coefficients([10, 30], "samples"), kinds)
    # 0.25 * w1 + 0.75 * w2
    np.testing.assert_allclose(s[0], [2.5, 5.0])
    np.testing.assert_allclose(s[1], [[3.0]])
    assert u[0].dtype == np.float32


def test_chunked_average_is_bit_identical_to_the_whole_array_sum():
    """``weighted_average`` works CHUNK entries at a time; every entry must still be the
    float64 sum, in client order, of ``c_i * float64(w_i)``, cast back: the whole-array
    formula, bit for bit (odd sizes across chunk borders, a 0-d and an empty entry,
    -0.0, float16 and float64 entries, coefficients that do not sum exactly to 1)."""
    from fedrcl_flwr.server.aggregation import CHUNK

    rng = np.random.default_rng(7)
    shapes = [(3 * CHUNK + 17,), (5, CHUNK // 3 + 1), (), (0, 4), (CHUNK - 1,)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.float16]
    clients = []
    for _ in range(4):
        ws = [(rng.standard_normal(sh) * 10).astype(dt) for sh, dt in zip(shapes, dtypes)]
        ws[0][:5] = -0.0
        clients.append(ws)
    coefs = rng.random(4)
    coefs /= 3 * coefs.sum()
    out = weighted_average(clients, coefs, ["param"] * len(shapes))
    for j, dt in enumerate(dtypes):
        want = np.zeros(shapes[j], np.float64)
        for c, ws in zip(coefs, clients):
            want = want + np.float64(c) * ws[j].astype(np.float64)
        want = want.astype(dt)
        assert out[j].dtype == want.dtype and out[j].shape == want.shape
        assert out[j].tobytes() == want.tobytes(), j


def test_a_non_finite_entry_is_found_in_any_chunk():
    """``check_update`` scans CHUNK entries at a time: a NaN or an infinity anywhere (the
    first entry, a chunk border, the last entry, a 0-d entry) is found; none, none."""
    from fedrcl_flwr.server.aggregation import CHUNK, check_update

    ref = [np.zeros(3 * CHUNK + 5, np.float32), np.zeros((), np.float64), np.zeros((0, 3))]
    assert check_update([r.copy() for r in ref], ref) is None
    for pos in (0, CHUNK - 1, CHUNK, 3 * CHUNK + 4):
        for bad in (np.nan, np.inf, -np.inf):
            w = [r.copy() for r in ref]
            w[0][pos] = bad
            assert check_update(w, ref) == "array 0 contains NaN or Inf", (pos, bad)
    w = [r.copy() for r in ref]
    w[1] = np.array(np.nan)
    assert check_update(w, ref) == "array 1 contains NaN or Inf"


def test_integer_counters_not_averaged():
    w = [[np.array([1.0]), np.array(3, np.int64)], [np.array([2.0]), np.array(8, np.int64)]]
    kinds = entry_kinds(w[0], [True, False])
    assert kinds == ["param", "count"]
    out = weighted_average(w, client_coefficients([1, 1], "uniform"), kinds)
    assert out[1] == 8 and out[1].dtype == np.int64


def test_sampling_depends_only_on_seed_and_round():
    a = sample_partitions(3, 7, 100, 5)
    assert a == sample_partitions(3, 7, 100, 5)
    assert a != sample_partitions(3, 8, 100, 5)
    assert len(set(a)) == 5 and all(0 <= i < 100 for i in a)


def test_configure_fit_sends_partitions_and_weights():
    w0 = [np.zeros(2, np.float32)]
    st = make(w0)
    ins = st.configure_fit(1, ndarrays_to_parameters(w0), FakeManager(10))
    pids = [fi.config["partition_id"] for _, fi in ins]
    assert pids == sample_partitions(0, 1, 10, 3)
    assert len({p.cid for p, _ in ins}) == 3
    for _, fi in ins:
        assert fi.config["run_round"] == 1
        np.testing.assert_array_equal(parameters_to_ndarrays(fi.parameters)[0], w0[0])


def test_aggregate_fit_uniform_vs_weighted():
    w0 = [np.zeros(2, np.float32)]
    res = [
        (FakeProxy("a"), fitres([np.array([1.0, 1.0], np.float32)], 100, 0)),
        (FakeProxy("b"), fitres([np.array([4.0, 7.0], np.float32)], 300, 1)),
    ]
    st = make(w0, weighting="uniform")
    params, _ = st.aggregate_fit(1, res, [])
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [2.5, 4.0])
    st = make(w0, weighting="samples")
    params, _ = st.aggregate_fit(1, res, [])
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [3.25, 5.5])


def test_aggregation_is_order_independent():
    w0 = [np.zeros(3, np.float32)]
    rng = np.random.default_rng(0)
    res = [
        (FakeProxy(str(i)), fitres([rng.normal(size=3).astype(np.float32)], 10 + i, i))
        for i in range(4)
    ]
    a = make(w0, weighting="samples")
    b = make(w0, weighting="samples")
    pa, _ = a.aggregate_fit(1, res, [])
    pb, _ = b.aggregate_fit(1, list(reversed(res)), [])
    np.testing.assert_array_equal(parameters_to_ndarrays(pa)[0], parameters_to_ndarrays(pb)[0])


def test_bad_results_dropped_and_counted():
    w0 = [np.zeros(2, np.float32)]
    good = (FakeProxy("a"), fitres([np.array([2.0, 2.0], np.float32)], 10, 0))
    nan = (FakeProxy("b"), fitres([np.array([np.nan, 1.0], np.float32)], 10, 1))
    shape = (FakeProxy("c"), fitres([np.zeros(3, np.float32)], 10, 2))
    st = make(w0)
    params, _ = st.aggregate_fit(1, [good, nan, shape], [RuntimeError("boom")])
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [2.0, 2.0])
    assert st._fit_info["failures"] == 3 and st._fit_info["num_clients"] == 1


def test_all_failed_keeps_model_then_aborts():
    w0 = [np.ones(2, np.float32)]
    st = make(w0, max_consecutive_failed_rounds=2)
    params, _ = st.aggregate_fit(1, [], [RuntimeError("x")])
    np.testing.assert_array_equal(parameters_to_ndarrays(params)[0], w0[0])
    with pytest.raises(AllClientsFailed, match="consecutive"):
        st.aggregate_fit(2, [], [RuntimeError("x")])


def test_the_screening_average_flags_any_non_finite_entry_and_reads_through_take():
    """``average_and_screen`` gives ``weighted_average``'s bytes; its finiteness flag is
    False for a NaN or an infinity of any client anywhere (a zero coefficient too:
    0 * inf is NaN), True otherwise; with ``take`` it averages what ``take`` returns
    (the client's arrays then give only the shapes), asked for each client's pieces in
    order, every entry covered to its size."""
    from fedrcl_flwr.server.aggregation import CHUNK, average_and_screen

    rng = np.random.default_rng(3)
    shapes = [(2 * CHUNK + 3,), (), (0, 2), (4,)]
    kinds = ["param", "buffer", "param", "count"]
    clients = [
        [rng.standard_normal(s).astype(np.float32) for s in shapes[:3]]
        + [np.array([1, 2, 3, i], np.int64)]
        for i in range(3)
    ]
    coefs = np.array([0.5, 0.5, 0.0])
    seen: dict = {}

    def take(i, j, start, stop):
        seen.setdefault((i, j), []).append((start, stop))
        return clients[i][j].reshape(-1)[start:stop].copy()

    zeros = [[np.zeros_like(a) for a in c] for c in clients]  # shapes only: never read
    out, finite = average_and_screen(zeros, coefs, kinds, take)
    assert finite
    assert all(
        a.tobytes() == b.tobytes() for a, b in zip(out, weighted_average(clients, coefs, kinds))
    )
    for i in range(3):
        for j, s in enumerate(shapes):
            pieces = seen.get((i, j), [])
            n = int(np.prod(s))
            covered = [p for p in pieces if p[1] > p[0]]
            assert sum(b - a for a, b in covered) == n, (i, j, pieces)
            assert all(b0 <= a1 for (_, b0), (a1, _) in zip(covered, covered[1:]))
    for client in range(3):  # the last has coefficient 0
        for pos in (0, CHUNK, 2 * CHUNK + 2):
            for bad in (np.nan, np.inf, -np.inf):
                w = [[a.copy() for a in c] for c in clients]
                w[client][0][pos] = bad
                assert not average_and_screen(w, coefs, kinds)[1], (client, pos, bad)
    w = [[a.copy() for a in c] for c in clients]
    w[1][1] = np.array(np.inf, np.float32)
    assert not average_and_screen(w, coefs, kinds)[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_uploads_by_reference_are_hashed_screened_and_averaged_in_one_pass(tmp_path, workers):
    """Through the strategy with uploads in store slots (one thread hashing as it
    averages, or threads averaging while others hash): all good, the round's model is
    the plain average; an upload whose slot was written again after it was sent, one
    with a NaN and one with an infinity are dropped with their reasons, and the model is
    the average of the rest, bit for bit."""
    from flwr.common import Code, FitRes, Status

    from fedrcl_flwr.app.wire import transport
    from fedrcl_flwr.protocol import FitReport
    from fedrcl_flwr.server.aggregation import CHUNK
    from fedrcl_flwr.weights.entries import Entry
    from fedrcl_flwr.weights.store import WeightStore
    from strategies.base import FederatedStrategy

    rng = np.random.default_rng(5)
    init = [rng.standard_normal(CHUNK + 9).astype(np.float32), np.array(0, np.int64)]
    k = 5

    def run_round(ups, tamper=None):
        st = FederatedStrategy(
            initial_weights=[a.copy() for a in init],
            trainable=[True, False],
            num_clients=k,
            clients_per_round=k,
            rounds=1,
        )
        st.average_workers = workers
        st.transport = transport.ServerTransport(WeightStore(tmp_path / str(id(ups))), uploads=k)
        (tmp_path / str(id(ups))).mkdir()
        sent = st.transport.send(st.weights)
        results = []
        for i, up in enumerate(ups):
            params = transport.reply(up, st.transport.for_client(sent, 1, i))
            res = FitRes(Status(Code.OK, ""), params, 10 + i, {})
            res.metrics = FitReport(partition_id=i, train_loss=0.1).to_metrics()
            results.append((None, res))
        if tamper is not None:
            tamper(results)
        st.aggregate_fit(1, results, [])
        return st

    ups = [[(init[0] + i).astype(np.float32), np.array(i, np.int64)] for i in range(k)]
    st = run_round(ups)
    want = weighted_average(ups, client_coefficients([1] * k, "uniform"), st.kinds)
    assert st.weights[0].tobytes() == want[0].tobytes() and st._round_errors == []

    bad = [[a.copy() for a in u] for u in ups]
    bad[1][0][CHUNK + 3] = np.nan
    bad[3][0][0] = np.inf

    def overwrite(results):  # client 2's slot holds other bytes now
        ref = transport.reference_of(results[2][1].parameters)
        store = WeightStore(ref["store"])
        other = [(init[0] * 7).astype(np.float32), np.array(9, np.int64)]
        store.publish_in_slot(Entry(other), ref["offset"], ref["size"])

    st = run_round(bad, overwrite)
    reasons = sorted(st._round_errors)
    assert len(reasons) == 3, reasons
    assert "partition 1: array 0 contains NaN or Inf" in reasons
    assert "partition 3: array 0 contains NaN or Inf" in reasons
    assert any(
        r.startswith("partition 2: undecodable parameters") and "written again" in r
        for r in reasons
    ), reasons
    rest = [bad[0], bad[4]]
    want = weighted_average(rest, client_coefficients([1, 1], "uniform"), st.kinds)
    assert st.weights[0].tobytes() == want[0].tobytes()


def test_a_threaded_average_gives_the_same_bytes_for_any_number_of_workers():
    """Entries cut into pieces averaged by 1, 2 or 3 threads (pieces across SEGMENT and
    CHUNK borders, a counter, an empty and a 0-d entry): the bytes of
    ``weighted_average``; a NaN in any piece still makes the flag False."""
    from fedrcl_flwr.server.aggregation import SEGMENT, average_and_screen

    rng = np.random.default_rng(11)
    shapes = [(2 * SEGMENT + 7,), (3,), (0,), (), (SEGMENT - 1,)]
    kinds = ["param", "count", "param", "buffer", "param"]
    clients = [
        [
            rng.integers(0, 9, s).astype(np.int64)
            if kind == "count"
            else (rng.standard_normal(s) * 5).astype(np.float32)
            for s, kind in zip(shapes, kinds)
        ]
        for _ in range(3)
    ]
    coefs = np.array([0.2, 0.3, 0.5])
    want = weighted_average(clients, coefs, kinds)
    for workers in (1, 2, 3):
        got, finite = average_and_screen(clients, coefs, kinds, workers=workers)
        assert finite and all(
            a.tobytes() == b.tobytes() and a.shape == b.shape for a, b in zip(got, want)
        ), workers
    clients[2][0][SEGMENT + 1] = np.nan
    assert not average_and_screen(clients, coefs, kinds, workers=2)[1]


def _their_state_dict_average(states: list[dict], sizes: list[int]) -> dict:
    """FedUV's server (sonhamin/FedUV ``train_fl.py``; RethinkFL's ``aggregate_nets`` is
    the same loop), transliterated: ``global_w[key] = net_para[key] * freq`` for the first
    client, ``+=`` for the others, then ``load_state_dict`` into buffers of the model's
    dtypes (an int64 counter gets the float sum truncated)."""
    import torch

    total = sum(sizes)
    freqs = [n / total for n in sizes]
    global_w: dict = {}
    for i, net_para in enumerate(states):
        for key in net_para:
            if i == 0:
                global_w[key] = net_para[key] * freqs[i]
            else:
                global_w[key] += net_para[key] * freqs[i]
    out = {}
    for key, v in global_w.items():
        buf = torch.empty_like(states[0][key])
        buf.copy_(v)
        out[key] = buf.numpy()
    return out


@pytest.mark.parametrize("workers", [1, 3])
def test_float32_average_is_the_authors_state_dict_loop_bit_for_bit(workers):
    import torch

    from fedrcl_flwr.server.aggregation import average_and_screen

    rng = np.random.default_rng(4)
    sizes = [37, 360, 101, 58]
    kinds = ["param", "buffer", "count"]
    clients = [
        [
            (rng.normal(size=300_000) * 3).astype(np.float32),  # several threaded pieces
            rng.uniform(0.5, 2.0, size=7).astype(np.float32),
            np.array(int(rng.integers(0, 200)), np.int64),
        ]
        for _ in sizes
    ]
    states = [{f"e{j}": torch.from_numpy(w.copy()) for j, w in enumerate(c)} for c in clients]
    theirs = _their_state_dict_average(states, sizes)
    coefs = client_coefficients(sizes, "samples")
    ours, finite = average_and_screen(clients, coefs, kinds, workers=workers, dtype="float32")
    assert finite
    for j in range(3):
        assert ours[j].dtype == clients[0][j].dtype
        np.testing.assert_array_equal(ours[j], theirs[f"e{j}"])
    # the default sums in float64: not their bytes, and the counter is the largest
    default = weighted_average(clients, coefs, kinds)
    assert not np.array_equal(default[0], theirs["e0"])
    np.testing.assert_allclose(default[0], theirs["e0"], rtol=1e-5, atol=1e-5)
    assert int(default[2]) == max(int(c[2]) for c in clients) != int(theirs["e2"])
    # through the strategy (server.average_dtype)
    w0 = [np.zeros_like(w) for w in clients[0]]
    res = [(FakeProxy(str(i)), fitres(c, n, i)) for i, (c, n) in enumerate(zip(clients, sizes))]
    st = make(w0, weighting="samples", average_dtype="float32", clients_per_round=4)
    params, _ = st.aggregate_fit(1, res, [])
    for j, got in enumerate(parameters_to_ndarrays(params)):
        np.testing.assert_array_equal(got, theirs[f"e{j}"])


def test_float32_average_refused_with_dp_or_secagg(tmp_path):
    from helpers import tiny_config

    from fedrcl_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match="average_dtype: float32.*privacy.secagg"):
        tiny_config(tmp_path, server={"average_dtype": "float32"}, privacy={"secagg": True})
    with pytest.raises(ConfigError, match="server.average_dtype.*must be one of"):
        tiny_config(tmp_path, server={"average_dtype": "float16"})
