"""Command line: ``fedrcl-flwr run | sweep | report | plot | partition | cache``.

Exit codes: 0 success, 2 bad input (configuration, data, command line, output directory in
use or holding an earlier run; one line, nothing written), 1 failed run (one line; details
in the run's ``run.log``), 130 interrupted, 141 the reader of the output went away
(``report ... | head``: nothing more is printed, no traceback). See README "Exit codes and failure behaviour".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.errors import ConfigError, one_line
from fedrcl_flwr.launch.preflight import (  # noqa: F401 - the checks' one home, re-exported
    check_output_dir,
    check_output_file,
    check_plot_path,
    load_experiment,
    prepare_data,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with one line (argparse would add its usage lines)
        print(
            f"fedrcl-flwr: error: {' '.join(str(message).split())} (see {self.prog} --help)",
            file=sys.stderr,
        )
        sys.exit(2)


def cmd_cache(args) -> int:
    """``cache ls`` / ``cache clear [KEY_PREFIX...]`` on the dataset cache."""
    from fedrcl_flwr.data.cache.layout import KEY_LEN, KEY_PREFIX_RE, default_cache_dir
    from fedrcl_flwr.data.cache.manage import clear, list_entries

    if args.cache_dir is not None and not args.cache_dir.strip():
        raise ConfigError("--cache-dir must be a directory path, got an empty string")
    root = (
        Path(args.cache_dir).expanduser().resolve()
        if args.cache_dir
        else default_cache_dir().resolve()
    )
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--cache-dir {root} is not a directory")
    if args.action == "ls":
        if args.keys:
            raise ConfigError("cache ls takes no keys")
        rows = list_entries(root)
        ours = [r for r in rows if r["status"] != "foreign"]
        print(
            f"dataset cache {root}: {len(ours)} entr{'y' if len(ours) == 1 else 'ies'}, "
            f"{sum(r['bytes'] for r in ours) / 2**20:.1f} MiB"
        )
        for r in rows:
            st = r["settings"]
            what = ", ".join(
                f"{k}={st[k]}"
                for k in ("image_size", "val_fraction", "seed")
                if st.get(k) not in (None, 0, 0.0)
            )
            created = (
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))
                if r["created"]
                else "?"
            )
            key = r["key"][:12] if r["status"] != "foreign" else r["key"]
            print(
                f"  {key}  {r['name']:<12} {r['bytes'] / 2**20:9.1f} MiB  "
                f"{created}  {r['status']}{'  ' + what if what else ''}"
            )
        return 0
    keys = [k.lower() for k in args.keys or []]
    for k in keys:
        if not KEY_PREFIX_RE.fullmatch(k):
            raise ConfigError(
                f"cache clear: {k!r} is not a key prefix (1 to "
                f"{KEY_LEN} hexadecimal digits, as 'cache ls' shows; "
                "no prefix at all clears every entry)"
            )
    removed, foreign = clear(root, keys)
    print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} from {root}")
    if foreign:
        print(
            f"left {len(foreign)} item(s) that are not dataset cache entries in place: "
            f"{', '.join(foreign[:10])}{' ...' if len(foreign) > 10 else ''}"
        )
    return 0


def _load_resume(args):
    """``run --resume DIR [EXPERIMENT.yaml] [--set ...]``: the run's experiment as
    recorded in ``DIR/config.yaml``, with only the changes ``RESUME_MAY_CHANGE`` allows
    (more rounds, evaluation/output cadence, resources); anything else is refused, naming
    the keys: the records after the resume must belong to the same experiment."""
    from fedrcl_flwr.config import RESUME_MAY_CHANGE, resume_refusals
    from fedrcl_flwr.run.run_files import CHECKPOINT_FILE, CONFIG_FILE

    run_dir = Path(args.resume).expanduser().resolve()
    cfg_file = run_dir / CONFIG_FILE
    if not cfg_file.is_file():
        raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there (not a run dir)")
    if not (run_dir / CHECKPOINT_FILE).is_file():
        raise ConfigError(
            f"--resume {run_dir}: no {CHECKPOINT_FILE} there (start runs with "
            "output.checkpoint_every > 0 to be able to resume them)"
        )
    recorded = load_experiment(str(cfg_file), [], str(run_dir))
    if args.experiment:
        cfg = load_experiment(args.experiment, args.set, str(run_dir))
        what = f"{args.experiment}{' with --set' if args.set else ''}"
    else:
        cfg = load_experiment(str(cfg_file), list(args.set or []), str(run_dir))
        what = "--set"
    refused = resume_refusals(recorded, cfg)
    if refused:
        shown = ", ".join(refused[:6]) + (
            f" and {len(refused) - 6} more" if len(refused) > 6 else ""
        )
        allowed = ", ".join(RESUME_MAY_CHANGE)
        raise ConfigError(
            f"--resume {run_dir}: {what} changes {shown}, which would make it "
            f"another experiment than the run it continues; only {allowed} "
            "may change on resume (start a new run with another --out "
            "instead)"
        )
    return cfg, run_dir


def cmd_run(args) -> int:
    """``run EXPERIMENT.yaml`` / ``run --resume DIR``: the config, every check before the
    run (:func:`fedrcl_flwr.launch.preflight.before_run`), the run directory claimed, the
    simulation, one line of result."""
    from fedrcl_flwr.errors import RunFailed
    from fedrcl_flwr.launch.preflight import before_run
    from fedrcl_flwr.launch.processes import OutputLock

    cfg, out_dir = _run_config(args)
    source = args.resume or args.experiment
    entry = before_run(cfg, source, out_dir, resume=bool(args.resume), overwrite=args.overwrite)
    _create_dir(out_dir)
    lock = OutputLock(out_dir)
    lock.acquire()
    completed = False
    try:
        _claim_run_dir(cfg, out_dir, overwrite=args.overwrite)
        t0 = time.time()
        try:
            summary = _simulate(cfg, out_dir, args, lock, entry)
            completed = True
        except RunFailed as exc:
            print(f"fedrcl-flwr: run failed: {exc}", file=sys.stderr)
            return 1
    finally:
        lock.release(remove=completed)  # a completed run leaves no lock file behind
    print(
        f"fedrcl-flwr: done in {time.time() - t0:.0f}s: {_result_text(cfg, summary)} -> {out_dir}"
    )
    return 0


def _run_config(args) -> tuple[ExperimentConfig, Path]:
    """The run's configuration and output directory: the experiment file's, or (``--resume
    DIR``) the recorded run's with the changes a resume allows."""
    if args.resume:
        if args.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        return _load_resume(args)
    if not args.experiment:
        raise ConfigError("give an EXPERIMENT.yaml (or --resume DIR)")
    cfg = load_experiment(args.experiment, args.set, args.out)
    return cfg, cfg.output_dir().resolve()


def _create_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"output directory {out_dir}: cannot create it ({exc.strerror or exc})"
        ) from None


def _claim_run_dir(cfg: ExperimentConfig, out_dir: Path, *, overwrite: bool) -> None:
    """With the lock held: clear an earlier run (``--overwrite``), mark the directory as
    the tool's run directory, write the resolved ``config.yaml``, say what runs."""
    from fedrcl_flwr.config import dump_config
    from fedrcl_flwr.run.progress import ema_note, shows_ema
    from fedrcl_flwr.run.results import clear_run_dir, has_marker, write_marker
    from fedrcl_flwr.run.run_files import CONFIG_FILE

    if overwrite:
        try:
            clear_run_dir(out_dir)
        except OSError as exc:
            raise ConfigError(f"--overwrite: {exc}") from None
    if not has_marker(out_dir, "run"):
        write_marker(out_dir, "run")  # the tool's run directory from now on
    dump_config(cfg, out_dir / CONFIG_FILE)
    print(
        f"fedrcl-flwr: {cfg.name}: {cfg.client.method} + {cfg.server.strategy}, "
        f"{cfg.federation.num_clients} clients, {cfg.federation.sampled_per_round()} "
        f"per round, {cfg.federation.rounds} rounds -> {out_dir}",
        flush=True,
    )
    metric = cfg.evaluation.report_metric
    if shows_ema(metric):
        print(f"fedrcl-flwr: {ema_note(cfg.evaluation.ema, metric)}", flush=True)


def _simulate(cfg: ExperimentConfig, out_dir: Path, args, lock, entry: Path) -> dict:
    from fedrcl_flwr import runner

    return runner.run_simulation_via_flower(
        cfg, out_dir, resume=bool(args.resume), verbose=args.verbose, lock=lock, dataset_entry=entry
    )


def _result_text(cfg: ExperimentConfig, summary: dict) -> str:
    """``final accuracy 71.20%`` (and the reported metric when it is another), then each
    client that failed in every round it was sampled (``client 17 failed in 12 of 12
    rounds it was sampled: ...``; three at most, the rest counted: all are in
    ``summary.json``'s ``client_failures``)."""
    from fedrcl_flwr.config.catalog import reported_metric
    from fedrcl_flwr.run.summaries import always_failing, reported_value

    acc = summary.get("final_accuracy")
    text = f"final accuracy {100 * acc:.2f}%" if acc is not None else "no evaluated round"
    metric = reported_metric(cfg.evaluation.report_metric, cfg.partition.scheme)
    if metric != "final":
        value = reported_value(summary, metric)
        text += f", {metric} (reported) " + (
            f"{100 * value:.2f}%" if value is not None else "missing"
        )
    failing = always_failing(summary)
    for phrase in failing[:3]:
        text += f"; {phrase}"
    if len(failing) > 3:
        text += f"; {len(failing) - 3} more clients failed in every round they were sampled"
    if failing:
        text += " (summary.json: client_failures)"
    return text


def cmd_report(args) -> int:
    """``report DIR...``: mean +- std per method and setting (fedrcl_flwr.report.formats)."""
    from fedrcl_flwr.report.formats import report

    notes: list = []
    print(report(args.dirs, args.format, args.metric, args.vs, notes), end="")
    if args.format == "markdown":
        print()
    for line in notes:  # beside a csv / latex table, not inside it
        print(f"fedrcl-flwr: {line}", file=sys.stderr)
    return 0


def cmd_plot(args) -> int:
    """``plot DIR...``: accuracy curves per method (mean +- std over seeds), per setting."""
    from fedrcl_flwr.report.figures import (
        client_plot_files,
        default_plot_out,
        domain_plot_files,
        plot_files,
        plot_groups,
    )

    if args.out is not None and not args.out.strip():
        raise ConfigError("--out must be a file stem, got an empty string")
    out = Path(args.out) if args.out is not None else default_plot_out(args.dirs)
    # checked before any run is read
    for path in plot_files(out) + domain_plot_files(out) + client_plot_files(out):
        check_output_file(path, "--out", create_parent=True)
    for path in plot_groups(args.dirs, out):
        print(f"written {path}")
    return 0


def cmd_sweep(args) -> int:
    """``sweep SWEEP.yaml``: plan and validate every run, then run those not finished."""
    from fedrcl_flwr.launch.plan import format_plan, take_over_earlier_runs
    from fedrcl_flwr.launch.preflight_sweep import before_sweep
    from fedrcl_flwr.launch.sweep import run_sweep
    from fedrcl_flwr.launch.sweep_spec import plan_sweep

    ncpu = os.cpu_count() or 1
    if not 1 <= args.jobs <= ncpu:
        raise ConfigError(
            f"--jobs must be between 1 and the {ncpu} CPUs of this machine, got {args.jobs}"
        )
    if args.out is not None and not args.out.strip():
        raise ConfigError("--out must be a directory path, got an empty string")
    runs, out_dir = plan_sweep(args.sweep, args.out, args.set)
    if args.dry_run:
        print(format_plan(runs, out_dir))
        for line in take_over_earlier_runs(runs, out_dir, dry_run=True):
            print(f"fedrcl-flwr sweep: {line}")
        return 0
    before_sweep(runs, out_dir)
    for line in take_over_earlier_runs(runs, out_dir):
        print(f"fedrcl-flwr sweep: {line}", flush=True)
    return run_sweep(runs, out_dir, jobs=args.jobs, verbose=args.verbose)


def cmd_partition(args) -> int:
    """``partition EXPERIMENT.yaml``: the clients' class counts (and domains) as a table,
    optionally a heatmap (``--plot``) and the split as a file (``--save``)."""
    from fedrcl_flwr.data.report import (
        class_counts,
        client_domains,
        format_counts_table,
        partition_title,
        plot_counts_heatmap,
    )
    from fedrcl_flwr.data.split_file import save_split_file
    from fedrcl_flwr.launch.preflight import before_partition

    if args.max_rows is not None and args.max_rows < 0:
        raise ConfigError(f"--max-rows must be >= 0, got {args.max_rows}")
    cfg, bundle, parts = before_partition(args.experiment, args.set, args.plot, args.save)
    counts = class_counts(parts, bundle.train_labels, bundle.num_classes)
    doms = client_domains(parts, bundle.train_domains, bundle.domain_names)
    print(format_counts_table(counts, max_rows=args.max_rows, domains=doms))
    if args.plot:
        try:
            plot_counts_heatmap(counts, args.plot, title=partition_title(cfg), domains=doms)
        except OSError as exc:
            raise ConfigError(f"--plot {args.plot}: cannot write ({exc.strerror or exc})") from None
        print(f"heatmap written to {args.plot}")
    if args.save:
        try:
            save_split_file(parts, args.save)
        except OSError as exc:
            raise ConfigError(f"--save {args.save}: cannot write ({exc.strerror or exc})") from None
        print(f"split written to {args.save} (use it with partition.scheme: file)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: every subcommand and flag, declared in one place
    (``tests/project/test_docs.py`` walks it against docs/cli.md), one ``_add_*_command``
    per subcommand, in the order ``--help`` lists them; the commands themselves are the
    ``cmd_*`` functions."""
    p = _Parser(prog="fedrcl-flwr", description=__doc__.splitlines()[0])
    p.add_argument("--verbose", action="store_true", help="show Flower/Ray logs")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for add_command in (
        _add_run_command,
        _add_report_command,
        _add_plot_command,
        _add_sweep_command,
        _add_cache_command,
        _add_partition_command,
    ):
        add_command(sub)
    return p


def _add_run_command(sub) -> None:
    """``run [EXPERIMENT]``: its arguments (:func:`cmd_run`)."""
    r = sub.add_parser("run", help="run an experiment as a Flower simulation")
    r.add_argument("experiment", nargs="?", help="experiment YAML")
    r.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key (dotted), repeatable",
    )
    r.add_argument("--out", help="output directory (overrides output.dir)")
    r.add_argument("--resume", metavar="DIR", help="continue the run in DIR")
    r.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results of an earlier run in the output directory",
    )
    r.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show Flower/Ray logs and internal tracebacks",
    )
    r.set_defaults(func=cmd_run)


def _add_report_command(sub) -> None:
    """``report DIR...``: its arguments (:func:`cmd_report`)."""
    from fedrcl_flwr.config.catalog import METRIC_NAMES
    from fedrcl_flwr.report.formats import FORMATS

    rep = sub.add_parser("report", help="table (mean ± std over seeds) from run or sweep dirs")
    rep.add_argument("dirs", nargs="+", help="run directories or a sweep's --out")
    rep.add_argument("--format", default="markdown", choices=list(FORMATS))
    rep.add_argument(
        "--metric",
        default=None,
        help=" | ".join(METRIC_NAMES) + " (default: the runs' "
        "report_metric, else their paper reference's, else final; inter-domain runs "
        "(partition.scheme: domain): its _domain_mean, with a column per domain)",
    )
    rep.add_argument(
        "--vs",
        metavar="ROW",
        action="append",
        help="also compare every row with ROW (a row name, label or method) "
        "seed by seed: per-seed differences, mean ± std, 95%% t-interval "
        "(repeat for several baselines: --vs A --vs B)",
    )
    rep.set_defaults(func=cmd_report)


def _add_plot_command(sub) -> None:
    """``plot DIR...``: its arguments (:func:`cmd_plot`)."""
    pl = sub.add_parser(
        "plot",
        help="accuracy curves per method, mean ± std over seeds "
        "(and per domain for inter-domain runs, and the per-client accuracy "
        "distribution, when recorded)",
    )
    pl.add_argument("dirs", nargs="+", help="run directories or a sweep's --out")
    pl.add_argument(
        "--out",
        default=None,
        help="output file stem (FILE.png and FILE.pdf are written; default: beside the "
        "directory, DIR_curves, or accuracy_curves beside several)",
    )
    pl.set_defaults(func=cmd_plot)


def _add_sweep_command(sub) -> None:
    """``sweep SWEEP.yaml``: its arguments (:func:`cmd_sweep`)."""
    sw = sub.add_parser("sweep", help="run a sweep file (settings x methods x seeds)")
    sw.add_argument("sweep", help="sweep YAML (base, grid, seeds, variants, set)")
    sw.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    sw.add_argument("--dry-run", action="store_true", help="list the runs, run nothing")
    sw.add_argument("--out", help="directory of the runs (default runs/sweeps/<name>)")
    sw.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key in every run, repeatable",
    )
    sw.add_argument("--verbose", action="store_true", help="show Flower/Ray logs in run logs")
    sw.set_defaults(func=cmd_sweep)


def _add_cache_command(sub) -> None:
    """``cache ls|clear``: its arguments (:func:`cmd_cache`)."""
    ca = sub.add_parser("cache", help="list or clear the dataset cache")
    ca.add_argument("action", choices=["ls", "clear"])
    ca.add_argument(
        "keys",
        nargs="*",
        metavar="KEY_PREFIX",
        help="clear only the entries whose key starts with one of these",
    )
    ca.add_argument(
        "--cache-dir",
        help="the cache directory (default: $FEDRCL_FLWR_CACHE_DIR"
        ", else $XDG_CACHE_HOME/fedrcl-flwr or ~/.cache/fedrcl-flwr)",
    )
    ca.set_defaults(func=cmd_cache)


def _add_partition_command(sub) -> None:
    """``partition EXPERIMENT``: its arguments (:func:`cmd_partition`)."""
    pa = sub.add_parser("partition", help="print / plot the client split of an experiment")
    pa.add_argument("experiment")
    pa.add_argument("--set", action="append", metavar="KEY=VALUE")
    pa.add_argument("--plot", metavar="FILE.png")
    pa.add_argument("--max-rows", type=int, default=None)
    pa.add_argument(
        "--save",
        metavar="FILE.json",
        help='write {"<client id>": [train indices]} (for partition.scheme: file)',
    )
    pa.set_defaults(func=cmd_partition)


PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer whose pipe closed


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a closed pipe is dropped
    instead of raising again when it is flushed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (tests)
        pass


def _terminate(signum, frame):  # SIGTERM: unwind so every started process is stopped
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import signal

    # Ctrl-C (SIGINT) and SIGTERM both unwind (KeyboardInterrupt: teardown, exit 130),
    # whatever this process inherited: Python turns SIGINT into KeyboardInterrupt only
    # when it starts with SIGINT's default action, and a command started in the
    # background of a shell script (``fedrcl-flwr run ... &``) starts with SIGINT
    # ignored, so a SIGINT sent to it did nothing and the run went on to the end
    for sig, handler in ((signal.SIGTERM, _terminate), (signal.SIGINT, signal.default_int_handler)):
        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread (embedded use): keep the default
            pass
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"fedrcl-flwr: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedrcl-flwr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (`report ... | head`)
        _drop_stdout()
        return PIPE_CLOSED
    except OSError as exc:
        line = _write_failure(exc)
        if line is None:
            return _internal_error(exc, args.verbose)
        print(f"fedrcl-flwr: run failed: {line}", file=sys.stderr)
        return 1
    except Exception as exc:  # an internal error: one line, the traceback with --verbose
        return _internal_error(exc, args.verbose)


def _internal_error(exc: Exception, verbose: bool) -> int:
    if verbose:
        raise exc
    one = " ".join(str(exc).split())[:500]
    print(
        f"fedrcl-flwr: internal error: {type(exc).__name__}: {one} (run again with "
        "--verbose for the traceback)",
        file=sys.stderr,
    )
    return 1


def _write_failure(exc: OSError) -> str | None:
    """The one line for a file the command could not write (a run file, or a full /
    read-only file system anywhere), else ``None`` (an internal error)."""
    import errno

    from fedrcl_flwr.run.run_files import RunFileError

    if isinstance(exc, RunFileError):
        return " ".join(str(exc).split())
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        where = f" {exc.filename}" if exc.filename else ""
        return f"cannot write{where}: {exc.strerror or exc} (free space there, then run again)"
    return None


def entry_point() -> None:
    """The ``fedrcl-flwr`` command. After the command has finished (every process it
    started is stopped, every file written and closed), the process ends with
    ``os._exit``: Python's own teardown of torch's libraries takes another ~0.6 s and
    nothing of ours runs at exit."""
    rc = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the output's reader went away before the last of it
            rc = PIPE_CLOSED if stream is sys.stdout and not rc else rc
        except (OSError, ValueError):  # nothing more to say
            pass
    os._exit(int(rc or 0))


if __name__ == "__main__":
    entry_point()
