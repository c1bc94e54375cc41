"""Flower ServerApp: builds the configured strategy, the centralised evaluation and the
run's recorder (metrics.jsonl, summary.json, model, plot, checkpoints)."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch
from flwr.common import Context
from flwr.server import (
    Server,
    ServerApp,
    ServerAppComponents,
    ServerConfig,
    SimpleClientManager,
)

from fedrcl_flwr.app.common import config_from_run_config, output_dir_from_run_config, quiet
from fedrcl_flwr.app.replies import INTERVAL, WIRE_INTERVAL, ReplyCollector
from fedrcl_flwr.app.wire.flower_private import engine_doorbell, two_messages_per_actor
from fedrcl_flwr.config import dump_config
from fedrcl_flwr.config.catalog import reported_metric
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.evaluation import EMATracker, evaluate_model
from fedrcl_flwr.run import runtime, timers
from fedrcl_flwr.run.checkpoint import load_checkpoint, save_checkpoint
from fedrcl_flwr.run.plots import run_title
from fedrcl_flwr.run.progress import format_round_line, shows_ema
from fedrcl_flwr.run.results import RunRecorder
from fedrcl_flwr.run.run_files import CONFIG_FILE
from strategies import strategy_class
from strategies.round_records import failure_counts

# when this module (torch, Flower, the project) finished importing: the start-up breakdown
# of ``benchmarks/bench_regimes.py`` (event ``serverapp_start``)
IMPORTED_AT = time.time()


def make_exchange(cfg, num_classes: int):
    """The signal exchange the client method needs (``None`` for most methods)."""
    from clients import client_class

    cls = client_class(cfg.client.method)
    settings = cls.exchange_settings(cls.resolve(cfg))
    if settings is None:
        return None
    # imported only here: its clustering imports SciPy (0.3 s of a run's start-up)
    from fedrcl_flwr.server.signal_exchange import SignalExchange

    return SignalExchange({**settings, **cfg.server.signals}, num_classes=num_classes)


def make_availability(cfg, model=None):
    """The dropout / straggler simulation (``federation.availability``), or ``None``; a
    straggler's workload counts its local steps as the clients train ``model``
    (``training.last_batch_rule``)."""
    from fedrcl_flwr import availability, client_eval
    from fedrcl_flwr.training import last_batch_rule

    if not availability.enabled(cfg):
        return None
    sizes = None
    if cfg.federation.availability.stragglers.speed is not None:  # workloads
        sizes = [
            len(client_eval.training_indices(cfg, i, part))
            for i, part in enumerate(runtime.client_partitions(cfg))
        ]
    if model is not None:
        rule = last_batch_rule(cfg.client.drop_last, model)
    else:
        rule = "drop" if cfg.client.drop_last else "keep"
    return availability.Availability.from_config(cfg, sizes, last_batch=rule)


def make_strategy(cfg, model, bundle, *, round_offset: int = 0, **callbacks):
    """The configured strategy around ``model``'s initial weights."""
    cls = strategy_class(cfg.server.strategy)
    pc = cfg.evaluation.per_client
    return cls(
        initial_weights=runtime.get_weights(model),
        trainable=runtime.trainable_mask(model),
        num_clients=cfg.federation.num_clients,
        clients_per_round=cfg.federation.sampled_per_round(),
        rounds=cfg.federation.rounds,
        seed=cfg.seed,
        weighting=cfg.server.weighting,
        average_dtype=cfg.server.average_dtype,
        eval_every=cfg.federation.eval_every,
        params=cfg.server.params,
        max_consecutive_failed_rounds=cfg.federation.max_consecutive_failed_rounds,
        round_timeout_s=cfg.federation.round_timeout_s,
        round_offset=round_offset,
        exchange=make_exchange(cfg, bundle.num_classes),
        availability=make_availability(cfg, model),
        per_client=(pc.every, pc.clients) if pc.every else None,
        privacy=cfg.privacy,
        **callbacks,
    )


def check_resume(cfg, out_dir) -> None:
    """Can the run in ``out_dir`` continue under ``cfg``? A :class:`ConfigError` (exit 2)
    when the checkpoint is unreadable (truncated, foreign) or does not fit the configured
    model or strategy (e.g. a ``--set`` that changed the model). Reads only."""
    from fedrcl_flwr.errors import CheckpointError

    try:
        ckpt = load_checkpoint(out_dir)
    except CheckpointError as exc:
        raise ConfigError(f"--resume {out_dir}: {exc}") from None
    done = ckpt["round"]
    if not isinstance(done, int) or isinstance(done, bool) or done < 0:
        raise ConfigError(
            f"--resume {out_dir}: the checkpoint's round {done!r} is not a round number"
        )
    if cfg.federation.rounds < done:
        raise ConfigError(
            f"--resume {out_dir}: federation.rounds={cfg.federation.rounds} is "
            f"fewer than the {done} rounds already done; a resume can only go "
            "on (give at least that many)"
        )
    bundle = runtime.load_bundle(cfg)
    model = runtime.initial_model(cfg, bundle)
    want = [tuple(np.shape(w)) for w in runtime.get_weights(model)]
    saved = ckpt["strategy"].get("weights") if isinstance(ckpt["strategy"], dict) else None
    have = [tuple(np.shape(w)) for w in saved or []]
    if want != have:
        diff = next(
            (i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have))
        )
        raise ConfigError(
            f"--resume {out_dir}: the checkpoint's model does not match the configured one "
            f"(model.name={cfg.model.name}: {len(want)} arrays, checkpoint: {len(have)}; "
            f"first difference at array {diff}); the model, dataset or number of classes "
            "must stay as the run started"
        )
    try:
        make_strategy(cfg, model, bundle, round_offset=int(ckpt["round"])).load_state_dict(
            ckpt["strategy"]
        )
    except Exception as exc:  # noqa: BLE001 - a state that does not fit is one input error
        raise ConfigError(
            f"--resume {out_dir}: the checkpoint does not fit strategy "
            f"'{cfg.server.strategy}' ({type(exc).__name__}: {exc})"
        ) from None


def build_server(
    cfg, out_dir, *, resume: bool = False, expected_nodes=None, overlap_evaluation: bool = False
):
    """Strategy + number of rounds left to run (also used in-process by tests and by
    :func:`fedrcl_flwr.app.inprocess.run_inprocess`). ``overlap_evaluation``: evaluate
    and checkpoint round r while round r+1 trains (the ServerApp: its clients train in
    other processes; see ``strategies/base.py``). The steps: the data and the initial
    model, the run's outputs (:func:`open_run_outputs`), the centralised evaluation
    (:func:`central_evaluation`), what each round's record and end write
    (:func:`record_writer`, :func:`checkpoint_writer`), then the strategy, restored from
    the checkpoint on resume."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bundle = runtime.load_bundle(cfg)
    model = runtime.initial_model(cfg, bundle)
    device = runtime.pick_device(cfg.client.device)
    eval_model = runtime.new_model(cfg, bundle).to(device)
    ema = EMATracker(cfg.evaluation.ema)
    ckpt = load_checkpoint(out_dir) if resume else None
    done = int(ckpt["round"]) if ckpt else 0
    recorder, tracker = open_run_outputs(cfg, out_dir, ckpt, ema)
    finish = tracker.finish if tracker else None
    strategy = make_strategy(
        cfg,
        model,
        bundle,
        evaluate_fn=central_evaluation(cfg, bundle, eval_model, device, ema),
        on_record=record_writer(cfg, recorder, tracker),
        on_checkpoint=checkpoint_writer(cfg, out_dir, recorder, tracker, ema, eval_model),
        expected_nodes=expected_nodes,
        round_offset=done,
        overlap_evaluation=overlap_evaluation,
    )
    strategy.tracker = tracker  # closed by whoever ends the run early (run_inprocess)
    if ckpt:
        strategy.load_state_dict(ckpt["strategy"])
    if done >= cfg.federation.rounds:
        recorder.client_failures = failure_counts(ckpt["strategy"] if ckpt else {})
        recorder.finish(None, before_summary=finish)
    return strategy, max(cfg.federation.rounds - done, 0)


def open_run_outputs(cfg, out_dir, ckpt, ema: EMATracker):
    """The run's recorder (``metrics.jsonl``, ``summary.json``, ...; on resume the kept
    records and the EMA of the checkpoint, else a fresh ``metrics.jsonl``), its
    ``config.yaml`` and its tracker (``output.tracker``: TensorBoard / W&B / MLflow, fed
    from the same records as ``metrics.jsonl``; ``None`` when off)."""
    from fedrcl_flwr.tracking.run_tracker import open_tracker

    done = int(ckpt["round"]) if ckpt else 0
    recorder = RunRecorder(
        out_dir,
        method=cfg.client.method,
        strategy=cfg.server.strategy,
        rounds=cfg.federation.rounds,
        target_rounds=cfg.evaluation.target_rounds,
        elapsed_before=float(ckpt["wall_time_s"]) if ckpt else 0.0,
        report_metric=reported_metric(cfg.evaluation.report_metric, cfg.partition.scheme),
        title=run_title(cfg),
        ema_factor=cfg.evaluation.ema,
    )
    if ckpt:
        recorder.load_existing(done)
        ema.value = ckpt["ema"]
    else:
        recorder.metrics_path.unlink(missing_ok=True)
    dump_config(cfg, out_dir / CONFIG_FILE)
    tracker = open_tracker(
        cfg, out_dir, out_dir / CONFIG_FILE, resume_after=done, kept_records=recorder.records
    )
    return recorder, tracker


def central_evaluation(cfg, bundle, eval_model, device, ema: EMATracker):
    """``evaluate_fn(round, weights) -> (loss, metrics)``: the global model on the test
    set (per domain when the test set has several), the EMA of its accuracy, the
    ``dataset.val_fraction`` hold-out, and when due the representation metrics and the
    robust accuracy."""
    groups = getattr(bundle, "test_domains", None)
    if groups is not None and len(set(groups.tolist())) < 2:
        groups = None
    ev = cfg.evaluation

    def evaluate_fn(rnd: int, weights):
        runtime.set_weights(eval_model, weights)
        res = evaluate_model(
            eval_model,
            bundle.test,
            device,
            batch_size=ev.batch_size,
            groups=groups,
            group_names=getattr(bundle, "domain_names", None),
        )
        metrics: dict[str, Any] = {
            "test_accuracy": res.accuracy,
            "ema_accuracy": ema.update(res.accuracy),
        }
        if res.per_group:
            metrics["domain_accuracy"] = res.per_group
        if getattr(bundle, "val", None) is not None:  # dataset.val_fraction hold-out
            val = evaluate_model(eval_model, bundle.val, device, batch_size=ev.batch_size)
            metrics["val_accuracy"], metrics["val_loss"] = val.accuracy, val.loss
        if ev.representation_every and rnd % ev.representation_every == 0:
            from fedrcl_flwr.representation import representation_record

            metrics.update(representation_record(eval_model, bundle.test, device))
        if ev.robust_every and (rnd % ev.robust_every == 0 or rnd == cfg.federation.rounds):
            from fedrcl_flwr.evaluation import robust_accuracy

            metrics.update(
                robust_accuracy(
                    eval_model,
                    bundle.test,
                    device,
                    eps=ev.robust_eps,
                    step=ev.robust_step,
                    steps=ev.robust_steps,
                    max_samples=ev.robust_samples,
                    seed=cfg.seed,
                )
            )
        return res.loss, metrics

    return evaluate_fn


def record_writer(cfg, recorder: RunRecorder, tracker):
    """``on_record(record)``: each evaluated round's record to ``metrics.jsonl``, the
    tracker and one progress line."""

    def on_record(rec: dict) -> None:
        rec["wall_time_s"] = round(recorder.wall_time(), 3)
        recorder.append(rec)
        if tracker is not None:
            tracker.log(rec)
        print(
            format_round_line(rec, cfg.federation.rounds, shows_ema(cfg.evaluation.report_metric)),
            flush=True,
        )

    return on_record


def checkpoint_writer(cfg, out_dir, recorder: RunRecorder, tracker, ema: EMATracker, eval_model):
    """``on_checkpoint(round, state)``, called after each round's record: the checkpoint
    when due, and after the final round the results (model, plot, then
    ``summary.json`` — written last, so the CLI may take a new summary as "every result
    of the run is on disk")."""

    def on_checkpoint(rnd: int, state: dict) -> None:
        every = cfg.output.checkpoint_every
        if every and (rnd % every == 0 or rnd == cfg.federation.rounds):
            save_checkpoint(
                out_dir,
                {
                    "round": rnd,
                    "strategy": state,
                    "ema": ema.value,
                    "wall_time_s": recorder.wall_time(),
                },
            )
            if tracker is not None:
                tracker.flush(rnd)
        if rnd >= cfg.federation.rounds:
            recorder.client_failures = failure_counts(state)
            model_state = None
            if cfg.output.save_model:
                runtime.set_weights(eval_model, state["weights"])
                model_state = {k: v.detach().cpu() for k, v in eval_model.state_dict().items()}
            recorder.finish(model_state, before_summary=tracker.finish if tracker else None)

    return on_checkpoint


def server_components(context: Context, simulation: bool = True):
    """The run's experiment, strategy and Flower server config. ``simulation``: the
    simulation's in-memory grid (weights may travel by reference: ``transport.choose``)."""
    if timers.enabled() or timers.progress_enabled():
        timers.server_event(
            "serverapp_start", process_start=timers.process_start_time(), imported=IMPORTED_AT
        )
    quiet()
    cfg = config_from_run_config(context.run_config)
    # the server evaluates round r while round r+1 trains: as many threads as a client
    torch.set_num_threads(max(1, int(cfg.simulation.num_cpus)))
    out_dir = output_dir_from_run_config(context.run_config, cfg)
    resume = str(context.run_config.get("resume", "false")).lower() in ("1", "true", "yes")
    nodes = context.run_config.get("expected-nodes", 0) or None
    strategy, rounds_left = build_server(
        cfg,
        out_dir,
        resume=resume,
        expected_nodes=int(nodes) if nodes else None,
        overlap_evaluation=True,
    )
    timers.server_event("serverapp_built")
    from fedrcl_flwr.app.wire.transport import choose

    strategy.transport = choose(
        cfg, context.run_config, simulation=simulation, uploads=strategy.clients_per_round
    )
    strategy.transport.prepare(strategy.weights)
    print(f"[fedrcl-flwr] {strategy.transport.note}", file=sys.stderr, flush=True)
    print(
        f"[fedrcl-flwr] {cfg.name}: {cfg.client.method} + {cfg.server.strategy}, "
        f"{rounds_left} rounds to run, output {out_dir}",
        file=sys.stderr,
        flush=True,
    )
    if strategy.dp is not None:
        print(
            f"[fedrcl-flwr] privacy.dp: Flower's {type(strategy.dp.wrapper).__name__}, "
            f"noise std {strategy.dp.std:g} per entry of the average",
            file=sys.stderr,
            flush=True,
        )
    return (
        cfg,
        strategy,
        ServerConfig(num_rounds=rounds_left, round_timeout=cfg.federation.round_timeout_s),
    )


def server_fn(context: Context, simulation: bool = True):
    """Flower's legacy server loop around the strategy, with every client of a round in
    flight at once: Flower's ``Server`` sends each client's instructions from a thread
    pool of ``min(32, cores + 4)`` threads by default, so with more clients per round than
    that the actors idled while replies travelled back and the next instructions out."""
    cfg, strategy, config = server_components(context, simulation)
    server = Server(client_manager=EagerClientManager(), strategy=strategy)
    server.set_max_workers(max(1, cfg.federation.sampled_per_round()))
    return ServerAppComponents(server=server, config=config)


class EagerClientManager(SimpleClientManager):
    """Flower's client manager for the legacy loop and the workflow API: its node list is
    refreshed by a thread every 5 s or on ``all()`` / ``num_available()`` / ``sample()``;
    ``wait_for`` asks every 50 ms instead of waiting for the thread."""

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        deadline = time.monotonic() + timeout
        while self.num_available() < num_clients:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True


def run_secagg(grid, context: Context, simulation: bool = True) -> None:
    """``privacy.secagg``: Flower's ``DefaultWorkflow`` with ``SecAggPlusWorkflow`` as its
    fit step, around the same strategy (as a ``LegacyContext``); the clients run
    ``secaggplus_mod`` (``client_app.privacy_mods``). The strategy receives each reporting
    client's ``FitRes`` (its metrics in the clear) with the unmasked average as parameters
    (``strategies/base.py``)."""
    from flwr.server import LegacyContext
    from flwr.server.workflow import DefaultWorkflow

    from fedrcl_flwr.app.validate import secagg_max_weight, secagg_workflow

    cfg, strategy, config = server_components(context, simulation)
    fit = secagg_workflow(cfg, max_weight=secagg_max_weight(cfg))
    print(
        f"[fedrcl-flwr] privacy.secagg: Flower's SecAggPlusWorkflow (shares "
        f"{fit.num_shares}, threshold {fit.reconstruction_threshold}, max weight "
        f"{fit.max_weight:g})",
        file=sys.stderr,
        flush=True,
    )
    DefaultWorkflow(fit_workflow=fit)(
        grid,
        LegacyContext(
            context=context, config=config, strategy=strategy, client_manager=EagerClientManager()
        ),
    )


app = ServerApp()


@app.main()
def main(grid, context: Context) -> None:
    """The ServerApp: Flower's legacy server loop on the strategy (``server_fn``), or with
    ``privacy.secagg`` the SecAgg+ workflow (:func:`run_secagg`)."""
    from functools import partial

    simulation = hasattr(grid, "pull_interval")  # the simulation's in-memory grid
    # first: the engine builds its actor pool and starts its look-up's thread once Ray is
    # up, seconds after the ServerApp started (flower_private)
    doorbell = engine_doorbell() if simulation else None
    pipeline = two_messages_per_actor() if simulation else None
    cfg = config_from_run_config(context.run_config)
    for patch in (doorbell, pipeline):
        if patch is not None:
            print(f"[fedrcl-flwr] {patch.note}", file=sys.stderr, flush=True)
    # one thread looks for every waiting client's reply: every 10 ms in memory, every
    # 0.2 s over the wire (Flower's own loop: one look-up per client every 0.1 s in
    # simulation, every 3 s under the Deployment Engine)
    grid = ReplyCollector(
        grid,
        interval=INTERVAL if simulation else WIRE_INTERVAL,
        on_send=doorbell.ring if doorbell is not None and doorbell.installed else None,
    )
    if cfg.privacy.secagg:
        run_secagg(grid, context, simulation)
    else:
        ServerApp(server_fn=partial(server_fn, simulation=simulation))(grid, context)
