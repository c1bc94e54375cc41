"""What a new user meets in the first hour, item by item —
the install (``pip install -e .`` is enough for the quickstart), the start-up and round
progress lines, the plots, the results files, the logs. All in process (one subprocess
without the ``[test]`` extra's modules), on tiny synthetic data."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedrcl_flwr.cli import main

ROOT = Path(__file__).resolve().parents[2]

# the [test] extra's modules (and the optional extras' ones): none may be needed by the
# quickstart's path
TEST_ONLY = (
    "pytest",
    "_pytest",
    "timm",
    "tensorboard",
    "wandb",
    "mlflow",
    "dp_accounting",
    "ruff",
    "mypy",
    "sklearn",
    "finch",
)

QUICKSTART_PATH = """
import json, sys
from pathlib import Path

# as if not installed: `import X` raises ModuleNotFoundError, importlib.util.find_spec(X)
# (how libraries probe for optional modules) answers None
for name in sys.argv[2].split(","):
    sys.modules[name] = None
import fedrcl_flwr.app.client_app, fedrcl_flwr.app.control, fedrcl_flwr.app.server_app
import fedrcl_flwr.runner
from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.cli import main
from fedrcl_flwr.launch.preflight import before_run, load_experiment

out = Path(sys.argv[1]).resolve()
sets = [
    "dataset.synthetic.num_train=600", "dataset.synthetic.num_test=200",
    "dataset.synthetic.image_size=16", "federation.num_clients=6",
    "federation.clients_per_round=2", "federation.participation=null",
    "federation.rounds=1", "client.local_epochs=1", "evaluation.target_rounds=[1]",
    "evaluation.per_client={every: 1, clients: unsampled}",
]
cfg = load_experiment("experiments/quickstart.yaml", sets, str(out))
before_run(cfg, "experiments/quickstart.yaml", out, resume=False, overwrite=False)
run_inprocess(cfg, out)
assert main(["report", str(out)]) == 0
assert main(["plot", str(out)]) == 0
loaded = {m.split(".")[0] for m, mod in list(sys.modules.items()) if mod is not None}
print("MODULES " + json.dumps(sorted(loaded)))
"""


def _install_closure() -> set:
    """The distributions ``pip install -e .`` installs: the closure of pyproject.toml's
    ``dependencies`` (with the extras they name) over the installed metadata."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo = [(Requirement(d), "") for d in deps]
    seen: set = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for ex in [""] + sorted(req.extras):
            if (name, ex) in seen:
                continue
            seen.add((name, ex))
            try:
                reqs = metadata.requires(req.name) or []
            except metadata.PackageNotFoundError:
                continue
            todo += [(Requirement(r), ex) for r in reqs]
    return {n for n, _ in seen}


def test_the_quickstart_needs_no_test_extra(tmp_path):
    """``pip install -e .`` is enough for the quickstart: its whole path (the checks, the
    data, the strategy and clients, the ServerApp / ClientApp / Control API modules,
    ``report`` and ``plot``) runs with every module of the ``[test]`` extra — and every
    other installed module that the project's ``dependencies`` do not bring — made
    unimportable, as on a clean ``pip install -e .``."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    closure = _install_closure() | {"fedrcl-flwr"}
    owners = metadata.packages_distributions()
    # every installed module that `pip install -e .` would not bring: a clean install
    absent = sorted(
        m
        for m, dists in owners.items()
        if m not in sys.stdlib_module_names
        and m.isidentifier()
        and not {canonicalize_name(d) for d in dists} & closure
    )
    # the optional packages that are installed here are among them (scikit-learn and
    # finch-clust come from extras that a test install may or may not have)
    installed_test_only = set(TEST_ONLY) & set(owners)
    assert installed_test_only <= set(absent), installed_test_only - set(absent)
    script = tmp_path / "path.py"
    script.write_text(QUICKSTART_PATH)
    res = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), ",".join(absent + list(TEST_ONLY))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    modules = json.loads(res.stdout.split("MODULES ", 1)[1])
    assert {"torch", "flwr", "matplotlib", "fedrcl_flwr"} <= set(modules)
    assert not set(modules) & set(absent + list(TEST_ONLY))
    # the run evaluated, per round, as many clients as it sampled, none of them sampled
    # (evaluation.per_client.clients: unsampled, the unbiased choice)
    from fedrcl_flwr.client_eval import unsampled_partitions
    from fedrcl_flwr.run.results import read_metrics
    from fedrcl_flwr.run.runtime import sample_partitions

    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1]
    for r in recs:
        sampled = sample_partitions(0, r["round"], 6, 2)
        ids = sorted(int(k) for k in r["client_accuracy"])
        assert ids == unsampled_partitions(0, r["round"], 6, sampled)
        assert len(ids) == 2 and not set(ids) & set(sampled)
    assert (tmp_path / "run_curves.png").is_file()  # plot DIR writes beside DIR


def test_readme_two_commands_and_the_cpu_route():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e . && fedrcl-flwr run experiments/quickstart.yaml" in readme
    assert 'pip install -e ".[test]" && python -m pytest -q' in readme
    assert "download.pytorch.org/whl/cpu" in readme  # the CPU-only route, PyTorch's index
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]"' in ci and "python -m pytest -q" in ci


# ------------------------------------------------------------------ while it runs


def test_round_lines_end_in_an_eta_from_round_two():
    from fedrcl_flwr.run.progress import format_round_line, round_eta

    recs = [{"round": r, "test_accuracy": 0.5, "wall_time_s": t} for r, t in ((1, 30.0),)]
    assert round_eta(recs, 10) is None  # round 1 holds the workers' start: no rate yet
    recs += [{"round": 2, "test_accuracy": 0.5, "wall_time_s": 34.0}]
    recs += [{"round": 3, "test_accuracy": 0.5, "wall_time_s": 40.0}]
    assert round_eta(recs[:2], 10) == pytest.approx(4.0 * 8)
    assert round_eta(recs, 10) == pytest.approx(5.0 * 7)  # (40 - 30) / 2 per round, 7 left
    assert round_eta(recs, 3) is None  # the last round: nothing left
    line = format_round_line(recs[2], 10, eta_s=round_eta(recs, 10))
    assert line.endswith("| ETA 35s"), line
    assert format_round_line(recs[2], 10, eta_s=3725).endswith("| ETA 1h02m")
    assert "ETA" not in format_round_line(recs[0], 10)
    # evaluated every 5 rounds: the rate is per round, not per record
    sparse = [{"round": 5, "wall_time_s": 10.0}, {"round": 10, "wall_time_s": 20.0}]
    assert round_eta(sparse, 20) == pytest.approx(20.0)


def test_start_up_phases_are_printed_as_they_happen(tmp_path, capsys, monkeypatch):
    """The runner's own steps, the run's Flower status as it changes, and the ServerApp's
    start-up events (the progress file the ServerApp's process writes) as lines; none
    after the first round's record, none starting with ``round `` (the round lines)."""
    import importlib

    from fedrcl_flwr.launch import follower
    from fedrcl_flwr.run import timers

    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv(timers.PROGRESS_VAR, str(progress))
    importlib.reload(timers)  # as a process started with the variable set
    try:
        shown = follower.StartupProgress(t0=1000.0, path=progress)
        shown.say("starting a private Flower SuperLink", at=1000.5)
        shown.status("starting")
        shown.status("starting")  # unchanged: said once
        timers.server_event("serverapp_start", process_start=1.0, imported=2.0)
        timers.server_event("serverapp_built")
        timers.server_event("sent", round=1, clients=5)
        timers.server_event("sent", round=2, clients=5)  # each event once per process
        shown.poll()
        shown.poll()
        shown.done = True  # the first round's record arrived
        shown.say("late")
        shown.status("running")
    finally:
        monkeypatch.delenv(timers.PROGRESS_VAR)
        importlib.reload(timers)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fedrcl-flwr: [   0.5s] starting a private Flower SuperLink"
    assert "Flower: the run is starting" in lines[1]
    assert "ServerApp's process is up" in lines[2]
    assert "built the data, the model and the strategy" in lines[3]
    assert "round 1 sent to 5 clients" in lines[4]
    assert len(lines) == 5 and all(ln.startswith("fedrcl-flwr: [") for ln in lines)
    assert not timers.progress_enabled()  # off again outside a run


def test_resume_says_from_which_round_it_goes_on(tmp_path):
    from fedrcl_flwr import runner
    from fedrcl_flwr.run.checkpoint import save_checkpoint

    save_checkpoint(tmp_path, {"round": 20, "strategy": {}, "ema": 0.5, "wall_time_s": 3.0})
    recs = [{"round": r} for r in range(1, 24)]  # killed at round 23, checkpoint at 20
    done = runner.checkpoint_round(tmp_path, recs)
    assert done == 20
    assert runner.resume_line(tmp_path, 40, done) == (
        f"fedrcl-flwr: resuming {tmp_path} from its checkpoint at round 20: rounds 21..40"
    )
    assert runner.resume_line(tmp_path, 20, 20).endswith("round 20: no round left")


def test_flower_log_drops_only_the_clis_polling(tmp_path):
    from fedrcl_flwr.runner import drop_polling_lines

    log = tmp_path / "flower.log"
    keep = [
        "INFO :      Starting Flower SuperLink\n",
        "INFO :      ControlServicer.StartRun\n",
        "2026-11-27T22:56:15Z INFO [uvicorn.access] 127.0.0.1:1 - "
        '"POST /v1/control/start-run HTTP/1.1" 200\n',
        "fedrcl-flwr timing: watchdog 0.01s\n",
    ]
    noise = [
        "\x1b[92mINFO \x1b[0m:      ControlServicer.ListRuns\n",
        "2026-11-27T22:56:15Z INFO [uvicorn.access] 127.0.0.1:40928 - "
        '"POST /v1/control/list-runs HTTP/1.1" 200\n',
    ]
    log.write_text(keep[0] + noise[0] + noise[1] + keep[1] + noise[0] * 5 + keep[2] + keep[3])
    assert drop_polling_lines(log) == 7
    text = log.read_text()
    assert text == "".join(keep) + (
        "fedrcl-flwr: 7 lines of the CLI's run-status polling (ListRuns) left out of this log\n"
    )
    assert drop_polling_lines(log) == 0 and log.read_text() == text
    assert drop_polling_lines(tmp_path / "missing.log") == 0


# ------------------------------------------------------------------ plots


def _fake_run(d: Path, seed: int, method: str = "fedavg", alpha: float = 0.3, acc=None):
    d.mkdir(parents=True)
    cfg = {
        "name": "digits-study",
        "seed": seed,
        "dataset": {"name": "synthetic"},
        "partition": {"scheme": "dirichlet", "alpha": alpha},
        "federation": {"num_clients": 100, "clients_per_round": 5, "rounds": 7},
        "client": {"method": method, "params": {}},
        "server": {"strategy": "fedavg"},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    accs = acc or [0.1 + 0.1 * r + 0.01 * seed for r in range(7)]
    recs = [
        {"round": r + 1, "test_accuracy": a, "ema_accuracy": a, "wall_time_s": float(r)}
        for r, a in enumerate(accs)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(
        json.dumps(
            {"method": method, "strategy": "fedavg", "rounds": 7, "final_accuracy": accs[-1]}
        )
    )
    return d


def _inside(fig, artist) -> bool:
    fig.canvas.draw()
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return box.x0 >= 0 and box.x1 <= fig.bbox.width + 0.5


def test_run_plot_names_its_run_with_integer_ticks_and_the_legend_below(tiny, tmp_path):
    """Each run's accuracy.png: titled by its setting (not "fedavg + fedavg"), wrapped,
    round ticks whole numbers, the legend under the axes (not over the curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrcl_flwr.run.plots import plot_accuracy, run_title

    cfg = tiny(federation={"rounds": 7, "num_clients": 100, "clients_per_round": 5})
    title = run_title(cfg)
    assert title == (
        "tiny: fedavg on synthetic, Dirichlet α=0.5, 100 clients (5 per round), 7 rounds"
    )
    cfg.server.strategy = "fedacg"
    assert "fedavg + fedacg" in run_title(cfg)
    recs = [{"round": r, "test_accuracy": 0.1 * r, "ema_accuracy": 0.08 * r} for r in range(1, 8)]
    captured = {}
    real_close = plt.close
    plt.close = lambda fig=None: captured.setdefault("fig", fig)
    try:
        plot_accuracy(recs, tmp_path / "accuracy.png", title=title + ", a long tail " * 3)
    finally:
        plt.close = real_close
    fig = captured["fig"]
    ax = fig.axes[0]
    assert "\n" in ax.get_title() and _inside(fig, ax.title)
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    legend = ax.get_legend()
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0
    real_close(fig)
    assert (tmp_path / "accuracy.png").stat().st_size > 5000


def test_plot_titles_wrap_and_plot_writes_beside_the_dir(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    from fedrcl_flwr.report.figures import curves_figure
    from fedrcl_flwr.report.grouping import group_runs
    from fedrcl_flwr.report.reading import load_runs

    sweep = tmp_path / "sweeps" / "study"
    for seed in range(2):
        _fake_run(sweep / f"fedavg_seed={seed}", seed)
        _fake_run(sweep / f"fedrcl-with-a-long-label_seed={seed}", seed, method="fedrcl")
    fig = curves_figure(group_runs(load_runs([sweep])))
    title = fig._suptitle
    assert "synthetic" in title.get_text() and "α=0.3" in title.get_text()
    assert "100 clients" in title.get_text() and _inside(fig, title)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0
    assert main(["plot", str(sweep)]) == 0  # no --out: beside the sweep directory
    out = capsys.readouterr().out
    for ext in ("png", "pdf"):
        assert (tmp_path / "sweeps" / f"study_curves.{ext}").is_file()
        assert f"written {tmp_path / 'sweeps' / f'study_curves.{ext}'}" in out
    assert main(["plot", str(sweep), "--out", str(tmp_path / "x" / "fig")]) == 0  # as before
    assert (tmp_path / "x" / "fig.png").is_file()


# ------------------------------------------------------------------ results


def test_summary_names_ema_and_test_accuracy_at_and_keeps_accuracy_at(tmp_path):
    from fedrcl_flwr.run.results import RunRecorder
    from fedrcl_flwr.run.summaries import reported_value

    rec = RunRecorder(tmp_path, method="fedavg", strategy="fedavg", rounds=4, target_rounds=[2, 4])
    for r, (acc, ema) in enumerate([(0.2, 0.2), (0.6, 0.24), (0.5, 0.27), (0.7, 0.31)], 1):
        rec.append({"round": r, "test_accuracy": acc, "ema_accuracy": ema})
    s = rec.summary()
    assert s["ema_accuracy_at"] == {"2": 0.24, "4": 0.31}
    assert s["test_accuracy_at"] == {"2": 0.6, "4": 0.7}
    assert s["accuracy_at"] == s["ema_accuracy_at"]  # old readers
    assert reported_value(s, "ema@4") == 0.31
    assert reported_value({"accuracy_at": {"4": 0.3}}, "ema@4") == 0.3  # an old summary


def test_report_counts_distinct_seeds_and_names_duplicates(tmp_path):
    from fedrcl_flwr.report.formats import report
    from fedrcl_flwr.report.grouping import build_table

    _fake_run(tmp_path / "a", 0, acc=[0.5] * 7)
    _fake_run(tmp_path / "b", 0, acc=[0.7] * 7)  # the same seed again: a duplicate
    _fake_run(tmp_path / "c", 1, acc=[0.9] * 7)
    groups, _ = build_table([tmp_path], "final")
    g = groups[0]
    assert g.n == 2 and g.duplicates == {0: 2}
    assert g.mean == pytest.approx(0.75)  # seed 0 counts once, as its mean 0.6
    assert g.std == pytest.approx(np.std([0.6, 0.9], ddof=1))
    text = report([tmp_path], metric="final")
    assert "(n=2, duplicates: seed 0 ×2)" in text and "n distinct seeds" in text
    assert "not a replicate" in text
    # two runs of one seed only: n=1, no ± 0.00 of a duplicate posing as a replicate
    only = tmp_path / "only"
    _fake_run(only / "a", 3, acc=[0.5] * 7)
    _fake_run(only / "b", 3, acc=[0.5] * 7)
    text = report([only], metric="final")
    assert "50.00 (n=1, duplicates: seed 3 ×2)" in text and "±" not in text.split("\n")[4]


def test_vs_with_one_row_says_there_is_nothing_to_compare(tmp_path, capsys):
    for seed in range(2):
        _fake_run(tmp_path / f"r{seed}", seed)
    assert main(["report", str(tmp_path), "--vs", "fedavg"]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == (
        "--vs fedavg: nothing to compare: the table has one row (fedavg)"
    )
    assert "Paired with" not in out
    assert main(["report", str(tmp_path), "--vs", "fedavg", "--format", "csv"]) == 0
    cap = capsys.readouterr()
    assert "nothing to compare" in cap.err and "nothing to compare" not in cap.out
    assert main(["report", str(tmp_path), "--vs", "nope"]) == 2  # still a bad row name


# ------------------------------------------------------------------ per-client evaluation


def test_unsampled_clients_are_the_unbiased_choice(tiny):
    """``clients: unsampled`` draws as many clients as a round samples, none of them
    sampled in that round, from the seed and round (a run with it:
    :func:`test_the_quickstart_needs_no_test_extra`); refused where a round samples every
    client."""
    from fedrcl_flwr.client_eval import unsampled_partitions
    from fedrcl_flwr.config import ConfigError

    picked = unsampled_partitions(0, 3, 8, [1, 5])
    assert len(picked) == 2 and not {1, 5} & set(picked) and picked == sorted(picked)
    assert picked == unsampled_partitions(0, 3, 8, [5, 1])
    assert len({tuple(unsampled_partitions(0, r, 100, [0, 1])) for r in range(20)}) > 10
    assert unsampled_partitions(0, 1, 3, [0, 1]) == [2]  # fewer left than sampled
    with pytest.raises(ConfigError, match="evaluation.per_client.clients' unsampled"):
        tiny(
            federation={"clients_per_round": 8},
            evaluation={"per_client": {"every": 1, "clients": "unsampled"}},
        )


# ------------------------------------------------------------------ docs


def test_docs_name_the_versions_of_their_figures():
    text = (ROOT / "docs" / "reproducing.md").read_text()
    assert re.search(r"66\.95 ± 6\.14", text) and re.search(r"67\.78 ± 4\.74", text)
    assert "flwr 1.42.0" in text and "torch 2.14.1" in text
    assert "MLFLOW_ALLOW_FILE_STORE" in (ROOT / "docs" / "research.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "a few minutes" not in readme.split("## Architecture")[0]
    assert "2-core" in readme
