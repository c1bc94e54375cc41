"""Our side of one round's weight traffic with each ``simulation.transport``.

One round = the server sends the global model to K clients and reads K uploads back.
Timed here, in one process, is only what *our* code does with the weights:

* ``flower``: the server encodes the model once (``.npy`` bytes,
  :mod:`fedrcl_flwr.codec`); each client decodes it (views), copies it into its model
  and encodes its upload; the
  server decodes the K uploads (views) and averages them as the strategy does
  (``average_and_screen``: the average and the NaN/Inf screen in one pass);
* ``shared``: the server publishes the model once (hash + one copy into a slot of the
  store's arena, :class:`fedrcl_flwr.weights.store.Arena`); each client copies it out of
  its process's mapping of the arena into its model, hashing the copy
  (``transport.Received.read_into``), and copies its upload into its slot, hashing as
  it copies; the server averages the K uploads where they lie, each piece copied out
  and hashed as the average reads it (``HashCheck.take``);
* ``files``: ``shared`` without the arena (what a run does when the slots would not fit
  in memory, and what every shared run did before them): a new file per entry, mapped
  afresh by each reader, the uploads deleted after the round.

The model sent changes every round (as a trained one does), so no write is skipped.

Not in it: what Flower does with the bytes of a ``flower`` message (its protobuf, the
SuperLink's object store, Ray's hand-over: several more copies of the model per
message each way), which is exactly what ``shared`` takes out (a message then carries a
~2 KB reference). So ``shared/flower`` here is the price of the store against our own
encoding only; ``bench_regimes.py --transport both`` measures whole runs.

    python benchmarks/bench_transport.py --model resnet18_gn --clients 5 --repeat 7
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median

import numpy as np
from _common import ROOT  # noqa: F401 - puts the checkout first on the path

from fedrcl_flwr.app.wire import transport
from fedrcl_flwr.models import build_model
from fedrcl_flwr.server.aggregation import (
    average_and_screen,
    average_workers,
    client_coefficients,
)
from fedrcl_flwr.weights.entries import HASH_ALGO
from fedrcl_flwr.weights.lifecycle import remove_store, temporary_store


def weights(model: str, num_classes: int) -> list:
    m = build_model(model, num_classes=num_classes, in_channels=3, image_size=32)
    return [v.detach().cpu().numpy().copy() for v in m.state_dict().values()]


def one_round(t: transport.ServerTransport, rnd: int, model: list, uploads: list) -> dict:
    """Seconds of each step of round ``rnd`` (K clients, one after the other)."""
    out = {}
    t0 = time.perf_counter()
    sent = t.send(model)
    out["server send"] = time.perf_counter() - t0
    replies = []
    into = [np.empty_like(a) for a in model]  # the client's model tensors
    t0 = time.perf_counter()
    for i, up in enumerate(uploads):
        mine = t.for_client(sent, rnd, i)  # the server's per-client message
        got = transport.Received(mine).read_into(into)  # as WireClient
        for dst, a in zip(into, got):
            if a is not dst:  # bytes of the message: set_weights copies them in
                np.copyto(dst, a)
        replies.append((None, _Res(transport.reply(up, mine))))
    out["clients: load + upload"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    opened = [transport.open_upload(res.parameters) for _, res in replies]
    checks = [c for _, c in opened]
    coefs = client_coefficients([1] * len(opened), "uniform")
    kinds = ["param" if a.dtype.kind == "f" else "count" for a in model]
    if any(c is not None for c in checks):  # as the strategy's _verify

        def take(i: int, j: int, start: int, stop: int) -> np.ndarray:
            return checks[i].take(j, start, stop)

        average_and_screen([a for a, _ in opened], coefs, kinds, take)
        for c in checks:
            c.finish()
    else:
        average_and_screen([a for a, _ in opened], coefs, kinds, workers=average_workers())
    t.release(replies)
    out["server: read + average uploads"] = time.perf_counter() - t0
    out["round"] = sum(out.values())
    return out


class _Res:
    def __init__(self, parameters):
        self.parameters = parameters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18_gn")
    ap.add_argument("--num-classes", type=int, default=100)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    model = weights(args.model, args.num_classes)
    mib = sum(a.nbytes for a in model) / 2**20
    uploads = [
        [a + (i + 1) * 1e-3 if a.dtype.kind == "f" else a for a in model]
        for i in range(args.clients)
    ]
    stores = [temporary_store() for _ in range(2)]
    try:
        kinds = {
            "flower": transport.ServerTransport(),
            "files": transport.ServerTransport(stores[0][0]),
            "shared": transport.ServerTransport(stores[1][0], uploads=args.clients),
        }
        times: dict = {k: [] for k in kinds}
        for rnd in range(1, args.repeat + 1):
            sent = [a + rnd * 1e-6 if a.dtype.kind == "f" else a for a in model]
            ups = [[a + rnd * 1e-6 if a.dtype.kind == "f" else a for a in u] for u in uploads]
            for k, t in kinds.items():
                times[k].append(one_round(t, rnd, sent, ups))
        assert kinds["shared"].arena is not None, kinds["shared"].arena_note
    finally:
        for _, root in stores:
            remove_store(root)
    import flwr
    import numpy
    import torch

    print(
        f"{args.model}: {len(model)} arrays, {mib:.1f} MiB; {args.clients} clients; "
        f"median of {args.repeat} rounds; store hash {HASH_ALGO}; 1-min load "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; flwr {flwr.__version__}, "
        f"torch {torch.__version__}, numpy {numpy.__version__}"
    )
    steps = list(times["flower"][0])
    print(f"  {'step (ms)':<26}{'flower':>10}{'files':>10}{'shared':>10}{'shared/flower':>15}")
    for s in steps:
        f, d, h = (median(r[s] for r in times[k]) * 1e3 for k in ("flower", "files", "shared"))
        print(f"  {s:<26}{f:10.1f}{d:10.1f}{h:10.1f}{h / f if f else float('nan'):15.2f}")
    f, d, h = (median(r["round"] for r in times[k]) for k in ("flower", "files", "shared"))
    print(f"our handling per round: files/flower = {d / f:.2f}, shared/flower = {h / f:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
