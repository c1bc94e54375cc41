"""Simulation overhead: wall time of N rounds through Flower (``fedrcl-flwr run``, 5
clients per round) vs the same local training in a bare sequential PyTorch loop in one
process (same model, data, partitions, steps, seeds, server averaging). Goal <= 1.15x.
Prints the ratio as its last line.

    python benchmarks/bench_simulation_overhead.py [--rounds 20] [--ray-cpus 1]

By default Ray may run as many clients at once as the machine has cores, so the
simulation can beat the sequential loop; ``--ray-cpus 1`` limits Ray to one core (one
client at a time) to isolate the pure framework overhead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import ROOT, run_cli_measuring

sys.path.insert(0, str(ROOT))

from fedrcl_flwr.results import read_metrics  # noqa: E402


def bare_loop(cfg) -> tuple[float, list[float]]:
    """Sequential FedAvg with plain PyTorch: no Flower, no Ray, no serialisation."""
    from fedrcl_flwr import runtime
    from fedrcl_flwr.evaluation import evaluate_model
    from fedrcl_flwr.training import (LocalTrainSettings, batch_size_for, cross_entropy_term,
                                      round_lr, train_local)

    torch.set_num_threads(1)
    t0 = time.time()
    bundle = runtime.load_bundle(cfg)
    parts = runtime.client_partitions(cfg)
    global_model = runtime.initial_model(cfg, bundle)
    model = runtime.new_model(cfg, bundle)
    c = cfg.client
    round_times = []
    for rnd in range(1, cfg.federation.rounds + 1):
        t_round = time.time()
        pids = runtime.sample_partitions(cfg.seed, rnd, cfg.federation.num_clients,
                                         cfg.federation.sampled_per_round())
        states = []
        for pid in pids:
            model.load_state_dict(global_model.state_dict())
            seed = runtime.client_seed(cfg.seed, rnd, pid)
            torch.manual_seed(seed)
            bs = batch_size_for(len(parts[pid]), c.batch_size, c.iterations_per_epoch)
            batches = runtime.make_batches(bundle.train, parts[pid], bs, seed)
            train_local(model, batches, [cross_entropy_term()],
                        LocalTrainSettings(lr=round_lr(c.lr, c.lr_decay, rnd),
                                           epochs=c.local_epochs, momentum=c.momentum,
                                           weight_decay=c.weight_decay, grad_clip=c.grad_clip),
                        torch.device("cpu"))
            states.append({k: v.clone() for k, v in model.state_dict().items()})
        avg = {k: sum(s[k].double() for s in states) / len(states) for k in states[0]}
        global_model.load_state_dict({k: v.to(states[0][k].dtype) for k, v in avg.items()})
        evaluate_model(global_model, bundle.test, torch.device("cpu"))
        round_times.append(time.time() - t_round)
    return time.time() - t0, round_times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ray-cpus", type=int, default=None,
                    help="cap Ray's CPUs (simulation.init_num_cpus); 1 = clients one at a time")
    args = ap.parse_args()
    from fedrcl_flwr.config import load_config

    sets = [f"federation.rounds={args.rounds}", "federation.clients_per_round=5",
            "federation.participation=null", "output.checkpoint_every=0",
            "simulation.num_cpus=1"]
    if args.ray_cpus:
        sets.append(f"simulation.init_num_cpus={args.ray_cpus}")
    exp = ROOT / "experiments" / "quickstart.yaml"
    cfg = load_config(exp, sets)
    bare, bare_rounds = bare_loop(cfg)
    print(f"bare sequential PyTorch loop: {bare:.1f}s for {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as out:
        cli = [str(exp), "--out", out]
        for s in sets:
            cli += ["--set", s]
        rc, wall, _ = run_cli_measuring(cli)
        flower_rounds = [r["round_time_s"] for r in read_metrics(Path(out))]
    if rc != 0:
        print("flower run failed", file=sys.stderr)
        return 1
    print(f"flower simulation (fedrcl-flwr run, incl. start-up): {wall:.1f}s")
    if len(flower_rounds) > 1:
        fl, ba = statistics.median(flower_rounds[1:]), statistics.median(bare_rounds[1:])
        print(f"first round: flower {flower_rounds[0]:.1f}s (Ray workers import torch and "
              f"build the data) vs bare {bare_rounds[0]:.1f}s; outside rounds (SuperLink + Ray "
              f"start-up, teardown): "
              f"{wall - sum(flower_rounds):.1f}s")
        print(f"steady state (median round 2..{args.rounds}): flower {fl:.2f}s vs bare "
              f"{ba:.2f}s = {fl / ba:.2f}x")
    print(f"simulation overhead ratio: {wall / bare:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
