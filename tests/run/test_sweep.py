"""Sweep files: expansion, naming, up-front validation, dry run; and (marked ``flwr``) a
sweep killed by SIGTERM and rerun: finished runs skipped, the checkpointed run resumed
(ending identical to an uninterrupted run), a stale attempt restarted."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import leftover_procs, tiny_experiment

from fedrcl_flwr.cli import main
from fedrcl_flwr.launch.processes import procs_with
from fedrcl_flwr.launch.sweep_spec import plan_sweep
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.run_files import LOCK_FILE, sweep_log_path

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    k: v
    for k, v in tiny_experiment(name="tiny_sweep", federation={"num_clients": 6}).items()
    if k != "output"  # the sweep gives each run its directory
}


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _sweep(tmp_path, **spec) -> Path:
    _write(tmp_path / "base.yaml", BASE)
    spec.setdefault("base", "base.yaml")
    return _write(tmp_path / "sweep.yaml", spec)


def test_grid_times_seeds_names_and_overrides(tmp_path):
    sw = _sweep(
        tmp_path,
        grid={"client.method": ["fedavg", "fedrcl"], "partition.alpha": [0.3, 1.0]},
        seeds=[0, 1],
    )
    runs, out = plan_sweep(sw, tmp_path / "out")
    assert out == (tmp_path / "out").resolve()
    assert len(runs) == 8
    names = [r.name for r in runs]
    # the grid values that vary are in the name (the method is the name's head already)
    assert re.fullmatch(r"fedavg_alpha=0.3_seed=0_[0-9a-f]{8}", names[0]), names[0]
    assert re.fullmatch(r"fedrcl_alpha=1.0_seed=1_[0-9a-f]{8}", names[-1]), names[-1]
    assert len(set(names)) == 8
    r = runs[5]  # fedrcl, alpha 0.3, seed 1
    assert (r.cfg.client.method, r.cfg.partition.alpha, r.cfg.seed) == ("fedrcl", 0.3, 1)
    assert r.cfg.output.dir == str(out / r.name) and r.out_dir == out / r.name
    assert r.cfg.output.checkpoint_every == 1  # forced: resumable from round 1
    assert all(x.state() == "new" for x in runs)


def test_base_relative_to_cwd_and_variants_with_labels(tmp_path, monkeypatch):
    (tmp_path / "exp").mkdir()
    _write(tmp_path / "exp" / "base.yaml", BASE)
    (tmp_path / "sweeps").mkdir()
    sw = _write(
        tmp_path / "sweeps" / "s.yaml",
        {
            "base": "exp/base.yaml",  # relative to the working directory, not the sweep file
            "variants": [
                {"label": "fedavg", "client.method": "fedavg"},
                {
                    "label": "fedprox-mu0.01",
                    "client.method": "fedprox",
                    "client.params": {"mu": 0.01},
                },
            ],
            "seeds": [3],
            "set": {"federation.rounds": 2},
        },
    )
    monkeypatch.chdir(tmp_path)
    runs, _ = plan_sweep(sw, tmp_path / "o")
    assert [r.name[:-9] for r in runs] == ["fedavg_seed=3", "fedprox-mu0.01_seed=3"]
    assert [r.cfg.label for r in runs] == ["fedavg", "fedprox-mu0.01"]  # for report/plot
    assert runs[1].cfg.client.params == {"mu": 0.01} and runs[1].cfg.seed == 3
    assert runs[0].cfg.client.params == {} and runs[0].cfg.federation.rounds == 2


def test_variants_without_labels_are_named_by_their_method(tmp_path):
    sw = _sweep(
        tmp_path,
        variants=[
            {"client.method": "fedavg"},
            {"client.method": "fedprox", "client.params": {"mu": 0.01}},
            {"client.method": "fedprox", "client.params": {"mu": 0.1}},
        ],
    )
    runs, _ = plan_sweep(sw, tmp_path / "o")
    assert [r.name[:-9] for r in runs] == ["fedavg_seed=0", "fedprox_seed=0", "fedprox_seed=0"]
    assert len({r.name for r in runs}) == 3 and all(r.cfg.label is None for r in runs)


def test_several_bases_are_a_setting_axis(tmp_path):
    _write(tmp_path / "a.yaml", BASE)
    _write(tmp_path / "b.yaml", {**BASE, "partition": {"scheme": "iid"}})
    sw = _write(
        tmp_path / "s.yaml",
        {"base": ["a.yaml", "b.yaml"], "grid": {"client.method": ["fedavg", "fedrcl"]}},
    )
    runs, _ = plan_sweep(sw, tmp_path / "o")
    assert [r.name[:-9] for r in runs] == ["fedavg_seed=0", "fedrcl_seed=0"] * 2
    assert len({r.name for r in runs}) == 4
    assert runs[2].cfg.partition.scheme == "iid"


def test_run_names_are_stable_when_the_sweep_grows(tmp_path):
    """Names came from whatever varied, so adding one setting renamed every
    run and recomputed the finished ones. A name is the label / method, the seed and a
    hash of the run's own experiment: adding a setting, a method or a seed keeps them."""
    from fedrcl_flwr.launch.plan import experiment_hash

    small = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedrcl"]}, seeds=[0])
    before = {r.name for r in plan_sweep(small, tmp_path / "o")[0]}
    assert before == {f"{n.split('_')[0]}_seed=0_{n[-8:]}" for n in before}
    grown = _write(
        tmp_path / "grown.yaml",
        {
            "base": "base.yaml",
            "seeds": [0, 1],
            "grid": {
                "client.method": ["fedavg", "fedrcl", "fedprox"],
                "partition.alpha": [0.5, 0.1],
            },
        },
    )  # 0.5 is the base's own value
    grown_runs = plan_sweep(grown, tmp_path / "o")[0]
    after = {r.name for r in grown_runs}
    # the grown grid key is shown in the names; the hash of every earlier run is kept, so
    # the grown sweep takes each over (renames it) instead of running it again
    assert {n[-8:] for n in before} <= {n[-8:] for n in after} and len(after) == 12
    assert {n for n in after if n[-8:] in {b[-8:] for b in before}} == {
        b.replace("_seed", "_alpha=0.5_seed") for b in before
    }
    from fedrcl_flwr.config import dump_config
    from fedrcl_flwr.launch.plan import take_over_earlier_runs

    out = tmp_path / "o"
    for r in plan_sweep(small, out)[0]:  # finished under the hash-only names
        r.out_dir.mkdir(parents=True)
        dump_config(r.cfg, r.out_dir / "config.yaml")
        (r.out_dir / "summary.json").write_text("{}")
    lines = take_over_earlier_runs(grown_runs, out)
    assert len(lines) == 2 and all("(done), renamed" in ln for ln in lines), lines
    assert sorted(r.state() for r in grown_runs).count("done") == 2
    # what only names, places or resources a run does not change its hash
    r = plan_sweep(small, tmp_path / "o")[0][0]
    h = experiment_hash(r.cfg)
    import dataclasses

    for change in ({"name": "other"}, {"label": "x"}):
        assert experiment_hash(dataclasses.replace(r.cfg, **change)) == h
    r.cfg.simulation.init_num_cpus = 1
    r.cfg.output.dir = "/elsewhere"
    assert experiment_hash(r.cfg) == h
    r.cfg.client.lr = 0.01
    assert experiment_hash(r.cfg) != h


def test_a_regrown_sweep_takes_over_runs_named_the_old_way(tmp_path, capsys):
    """A sweep directory written before stable names (``method=fedavg_seed=0``): a
    finished run holding a planned experiment is renamed to its planned name, not run
    again; anything else there is left untouched, with one note; nothing is deleted."""
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedrcl"]}, seeds=[0])
    out = tmp_path / "out"
    runs, _ = plan_sweep(sw, out)
    old = out / "method=fedavg_seed=0"
    old.mkdir(parents=True)
    from fedrcl_flwr.config import dump_config

    dump_config(runs[0].cfg, old / "config.yaml")
    (old / "summary.json").write_text('{"final_accuracy": 0.5}')
    (old / "metrics.jsonl").write_text('{"round": 3, "test_accuracy": 0.5}\n')
    (out / "_logs").mkdir()
    (out / "_logs" / "method=fedavg_seed=0.log").write_text("the old log\n")
    stranger = out / "method=fedavg_seed=7"  # not planned: left alone
    stranger.mkdir()
    other = dict(BASE, seed=7)
    _write(stranger / "config.yaml", other)
    (stranger / "summary.json").write_text('{"final_accuracy": 0.4}')
    unfinished = out / "method=fedrcl_seed=0"  # planned, but never got a round: left
    unfinished.mkdir()
    dump_config(runs[1].cfg, unfinished / "config.yaml")
    assert main(["sweep", str(sw), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"method=fedavg_seed=0: holds run 1 (done), to be renamed {runs[0].name}" in text
    assert "2 other run directories" in text and old.exists()  # a dry run changes nothing
    from fedrcl_flwr.launch.plan import take_over_earlier_runs

    lines = take_over_earlier_runs(runs, out)
    assert lines[0] == f"method=fedavg_seed=0: holds run 1 (done), renamed {runs[0].name}"
    assert "left untouched" in lines[1]
    assert not old.exists() and runs[0].state() == "done"
    assert (runs[0].out_dir / "metrics.jsonl").read_text().startswith('{"round": 3')
    assert (out / "_logs" / f"{runs[0].name}.log").read_text() == "the old log\n"
    assert stranger.exists() and unfinished.exists() and runs[1].state() == "new"
    from fedrcl_flwr.launch.preflight_sweep import check_existing

    check_existing(runs)  # the renamed directory holds the planned experiment


@pytest.mark.parametrize(
    "spec,needle",
    [
        ({"grid": {"client.method": ["fedavg", "nope"]}}, "client.method"),
        ({"grid": {"partition.alpha": [0.3, -1]}}, "partition.alpha"),
        ({"grid": {"partition.nonsense": [1]}}, "partition.nonsense"),
        (
            {"variants": [{"client.method": "fedprox", "client.params": {"bogus": 1}}]},
            "client.params",
        ),
        ({"grid": {"client.method": "fedavg"}}, "grid.client.method"),
        ({"seeds": [0, 0]}, "seeds"),
        ({"variants": [{"label": "x"}, {"client.method": "fedavg"}]}, "label"),
        ({"gird": {}}, "gird"),
        ({"base": "missing.yaml"}, "missing.yaml"),
    ],
)
def test_bad_combination_exits_2_before_anything_runs(tmp_path, capsys, spec, needle):
    sw = _sweep(tmp_path, **spec)
    out = tmp_path / "out"
    assert main(["sweep", str(sw), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(sw) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing started


def test_cli_set_applies_to_every_run_but_not_to_varied_keys(tmp_path, capsys):
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedrcl"]})
    runs, _ = plan_sweep(sw, tmp_path / "o", ["federation.rounds=7"])
    assert all(r.cfg.federation.rounds == 7 for r in runs)
    assert main(["sweep", str(sw), "--set", "client.method=fedavg", "--dry-run"]) == 2
    assert "varies this key" in capsys.readouterr().err


def test_dry_run_lists_runs_and_their_state(tmp_path, capsys):
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedrcl"]}, seeds=[0, 1])
    out = tmp_path / "out"
    runs, _ = plan_sweep(sw, out)
    (out / runs[1].name).mkdir(parents=True)  # fedavg, seed 1
    (out / runs[1].name / "summary.json").write_text("{}")
    assert main(["sweep", str(sw), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("4 runs")
    assert f"{runs[2].name}  [new]" in text and runs[2].name.startswith("fedrcl_seed=0_")
    assert f"{runs[1].name}  [done]" in text
    assert not (out / "_configs").exists()


def test_a_run_dir_holding_another_experiment_stops_the_sweep(tmp_path, capsys):
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedrcl"]})
    out = tmp_path / "out"
    runs, _ = plan_sweep(sw, out)
    other = dict(BASE, federation={**BASE["federation"], "rounds": 9})
    (out / runs[0].name).mkdir(parents=True)
    _write(out / runs[0].name / "config.yaml", other)
    assert main(["sweep", str(sw), "--out", str(out)]) == 2
    assert "different experiment" in capsys.readouterr().err


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")} for r in recs]


@pytest.mark.slow
@pytest.mark.flwr
def test_sweep_killed_by_sigterm_and_rerun_equals_uninterrupted(tmp_path):
    """Three runs, one at a time: ``a`` finished already (its directory made by hand, as a
    finished run leaves it), ``b`` really run and stopped by SIGTERM once round 1 is
    checkpointed, ``c`` started once but never checkpointed (a stale attempt) and reached
    only by the rerun. The rerun skips ``a``, resumes ``b`` and starts ``c`` afresh
    (clearing its stale files); ``b`` ends with the metrics of an uninterrupted run of the
    same configuration (in-process, the same computation as Flower's: the clients and the
    strategy are the same objects, driven round by round). Every client of ``c`` fails
    (fault injection): it is recorded as failed with its first client error and exactly its
    own rounds, the others still complete, and the rerun exits 1. ``c`` is also the suite's
    real ``run`` in which no client ever trains: exit 1 with one line naming the first
    client error, its round line saying so, details in its run.log. (One real run, its
    resume and one failing run, not the eight of a paper-table grid: the suite's time.)"""
    import torch

    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import dump_config, load_config
    from fedrcl_flwr.run.results import write_marker

    # b: ten short rounds (two local epochs of the tiny task): the kill, sent once round 1
    # is checkpointed, lands with rounds to spare while b is part-way
    sw = _sweep(
        tmp_path,
        variants=[
            {"label": "a", "client.method": "fedavg"},
            {
                "label": "b",
                "client.method": "fedrcl",
                "federation.rounds": 10,
                "client.local_epochs": 2,
            },
            {
                "label": "c",
                "client.method": "faulty",
                "client.params": {"mode": "raise", "partitions": [-1]},
                "federation.rounds": 2,  # round 1's line says so, round 2 ends the run
                "federation.max_consecutive_failed_rounds": 5,
            },
        ],
    )
    out = tmp_path / "out"
    runs, _ = plan_sweep(sw, out)
    a, b, c = runs
    for r, files in (
        (
            a,
            {
                "summary.json": '{"final_accuracy": 0.25}',
                "metrics.jsonl": '{"round": 3, "test_accuracy": 0.25}\n',
            },
        ),
        (c, {"metrics.jsonl": '{"round": 1, "test_accuracy": 0.99}\n', "flower.log": "stale"}),
    ):
        r.out_dir.mkdir(parents=True)
        write_marker(r.out_dir, "run")  # as `run` marks the directories it creates
        dump_config(r.cfg, r.out_dir / "config.yaml")
        for name, text in files.items():
            (r.out_dir / name).write_text(text)
    assert [r.state() for r in runs] == ["done", "new", "new"]
    mtime = (a.out_dir / "summary.json").stat().st_mtime_ns
    args = [sys.executable, "-m", "fedrcl_flwr.cli", "sweep", str(sw), "--out", str(out)]
    tag = uuid.uuid4().hex  # every process of this sweep inherits it (other sessions' don't)
    env = {**os.environ, "FEDRCL_TEST_TAG": tag}
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env
    )
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if b.state() == "resume":  # round 1 (of 10) checkpointed: nine rounds of margin
            break
        time.sleep(0.1)
    assert proc.poll() is None, "sweep ended before it could be killed:\n" + proc.stdout.read()
    homes = [ln for ln in (b.out_dir / LOCK_FILE).read_text().splitlines()[1:] if ln]
    proc.send_signal(signal.SIGTERM)
    first, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, first
    # a Ray agent of a run stopped during its start-up can take over 10 s to exit
    deadline = time.time() + 30
    while (
        left := procs_with(f"FEDRCL_TEST_TAG={tag}") + [p for h in homes for p in procs_with(h)]
    ) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"runs left processes behind: {left}"
    assert [r.state() for r in runs] == ["done", "resume", "new"], first
    status = json.loads((out / "sweep_status.json").read_text())
    assert status[b.name]["status"] == "interrupted" and c.name not in status, status

    res = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr  # c failed, the others went on
    assert "1 finished already, 2 to run" in res.stdout
    assert f"run 2/3 {b.name}: resuming after round" in res.stdout
    assert f"run 3/3 {c.name}: started" in res.stdout
    # one progress line per finished round: run i/N, name, round, accuracy, ETA
    assert any(
        line.startswith(f"run 2/3 {b.name}")
        and "round 10/10" in line
        and "acc " in line
        and "ETA " in line
        for line in res.stdout.splitlines()
    )
    assert (a.out_dir / "summary.json").stat().st_mtime_ns == mtime  # not run again
    status = json.loads((out / "sweep_status.json").read_text())
    assert {k: v["status"] for k, v in status.items()} == {
        a.name: "done",
        b.name: "done",
        c.name: "failed",
    }, status
    assert status[c.name]["exit_code"] == 1 and "injected" in status[c.name]["error"], status
    # c is also the suite's real `run` whose every client fails: exit 1 (above) with one
    # line naming the first client error, the round line says so, the details stay in its
    # run.log, no summary, nothing of the run left behind
    c_log = sweep_log_path(out, c.name).read_text()
    err = [ln for ln in c_log.splitlines() if "no client trained" in ln]
    assert len(err) == 1 and "no client trained in any of the 2 rounds" in err[0], c_log
    assert "first client error: RuntimeError: injected failure on partition" in err[0]
    assert (
        "ROUND FAILED (model unchanged): every client failed" in c_log and "Traceback" not in c_log
    ), c_log
    assert not (c.out_dir / "summary.json").exists()
    assert "AllClientsFailed" in (c.out_dir / "run.log").read_text()
    assert not leftover_procs(), "the rerun left processes behind"
    assert res.stderr.count("FAILED") == 1 and "Traceback" not in res.stderr, res.stderr
    assert "2/3 runs finished, 1 failed" in res.stdout
    # the stale attempt's files are gone: its own two (failed) rounds only
    assert not (c.out_dir / "flower.log").read_text().startswith("stale")
    recs = read_metrics(c.out_dir)
    assert [x["round"] for x in recs] == [1, 2] and all(x["round_failed"] for x in recs), recs

    got = read_metrics(b.out_dir)
    assert [x["round"] for x in got] == list(range(1, 11))  # every round exactly once
    ref_dir = tmp_path / "ref" / b.name
    cfg = load_config(b.out_dir / "config.yaml", [f"output.dir={ref_dir}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ClientApp / ServerApp (simulation.num_cpus = 1)
    try:
        run_inprocess(cfg, ref_dir)
    finally:
        torch.set_num_threads(threads)
    assert _strip(got) == _strip(read_metrics(ref_dir))
    assert (
        json.loads((b.out_dir / "summary.json").read_text())["final_accuracy"]
        == json.loads((ref_dir / "summary.json").read_text())["final_accuracy"]
    )


# ------------------------------------------------------------- the paper tables' sweeps

SWEEPS = sorted((ROOT / "experiments" / "sweeps").glob("*.yaml"))


def test_a_sweep_file_per_paper_table():
    names = {p.stem for p in SWEEPS}
    want = (
        {f"fedrcl_table{t}" for t in ("1", "2", "3", "4", "5", "A", "C", "D")}
        | {
            "univarfl_table1",
            "univarfl_table2",
            "synthetic_cpu",
            "fedccl_figure5",
            "fedccl_figure6",
        }
        | {f"fedccl_table{t}" for t in range(1, 9)}
    )
    assert want <= names, want - names


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_paper_sweep_expands_validates_and_finds_its_paper_values(path, capsys):
    """What --dry-run does (plan + validate every run), and every run of a table sweep
    finds the paper's number for its row and column in its reference."""
    from fedrcl_flwr.config import to_dict
    from fedrcl_flwr.report.grouping import Group, paper_value
    from fedrcl_flwr.report.reading import Run

    assert main(["sweep", str(path), "--dry-run", "--out", "/nonexistent/sweep"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("runs -> /nonexistent/sweep")
    runs, _ = plan_sweep(path, "/nonexistent/sweep")
    seeds = {r.cfg.seed for r in runs}
    if path.stem == "synthetic_cpu":
        assert len(runs) == 8 and all(r.cfg.dataset.name == "synthetic" for r in runs)
        return
    if path.stem == "digits_study":  # a study on scikit-learn's digits, no paper table
        assert len(runs) == 30 and {r.cfg.label for r in runs} == {
            "fedavg",
            "fedprox",
            "fedrcl",
            "univarfl_proj",
            "univarfl_noproj",
        }
        return
    if path.stem == "fedccl_ablation_digits":  # FedCCL's open choices, no paper values
        assert len(runs) == 30 and seeds == {0, 1, 2, 3, 4}
        by = {r.cfg.label: r.cfg for r in runs}
        assert set(by) == {
            "fedavg",
            "fpl",
            "fedccl",
            "fedccl_finest",
            "fedccl_fc1",
            "fedccl_localmean",
        }
        assert all(
            c.dataset.name == "digit5" and c.partition.scheme == "domain" for c in by.values()
        )
        assert {lab: (c.client.method, c.client.params) for lab, c in by.items()} == {
            "fedavg": ("fedavg", {}),
            "fpl": ("fpl", {}),
            "fedccl": ("fedccl", {}),
            "fedccl_finest": ("fedccl", {"signal_level": "finest"}),
            "fedccl_fc1": ("fedccl", {"feature": "fc1"}),
            "fedccl_localmean": ("fedccl", {"local_signal": "mean"}),
        }
        assert {(c.federation.rounds, c.federation.num_clients) for c in by.values()} == {(25, 4)}
        return
    if path.stem == "research_features":  # the features on synthetic data, no paper
        assert all(r.cfg.dataset.name == "synthetic" for r in runs)
        assert {r.cfg.output.tracker_group for r in runs} == {"research_features"}
        by = {r.cfg.label: r.cfg for r in runs}
        assert {"per_client", "all_domains", "unreliable", "fedrcl_both"} <= set(by)
        assert by["per_client"].evaluation.per_client.finetune_steps > 0
        assert by["all_domains"].evaluation.per_client.clients == "all"
        assert by["unreliable"].federation.availability.stragglers.deadline is not None
        return
    if path.stem == "unreliable_clients":  # the README's dropout study
        assert len(runs) == 18 and seeds == {0, 1, 2}
        assert {(r.cfg.client.method, r.cfg.federation.availability.dropout) for r in runs} == {
            (m, p) for m in ("fedavg", "fedrcl") for p in (0.0, 0.2, 0.5)
        }
        return
    assert seeds == {0, 1, 2}
    if path.stem.startswith("fedccl_figure"):
        assert all(r.cfg.reference is None for r in runs)
        return
    metric = "ema@1000" if path.stem.startswith("fedrcl") else None
    for r in runs:
        d = to_dict(r.cfg)
        m = metric or r.cfg.reference[0]["metric"]
        value, _ = paper_value(Group("k", [Run(r.out_dir, d, {}, [])], d), m)
        assert value is not None, f"{path.name}: run {r.name} has no paper value"


def test_resource_errors_stop_the_sweep_up_front(tmp_path):
    """Runs asking for a GPU on a machine without one are an input error of the sweep:
    exit 2 before any run starts, naming the run."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    sw = _sweep(
        tmp_path, grid={"client.method": ["fedavg", "fedrcl"]}, set={"simulation.num_gpus": 1.0}
    )
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "fedrcl_flwr.cli", "sweep", str(sw), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "run 'fedavg_seed=0_" in res.stderr and "no CUDA GPU" in res.stderr
    assert "Traceback" not in res.stderr and not out.exists()


def test_eta_comes_from_rounds_of_the_runs_in_flight():
    """16 runs x 30 rounds, 2 at a time, ~20 s start-up and ~1 s rounds: the
    old estimate (elapsed / rounds done x rounds left) said 4 h 17 min after the first
    rounds; from the measured round time and overheads it is the sweep's real length."""
    from fedrcl_flwr.launch.sweep_status import SweepEta, _fmt_eta

    timer = SweepEta(jobs=2)
    assert timer.eta([30, 30], [30] * 14) is None  # nothing measured yet: "?"
    for _ in range(2):  # each run in flight recorded its first round 21 s after launch
        timer.observe_startup(21.0)
        timer.observe_round(3.0, first_of_launch=True)
    assert timer.eta([29, 29], [30] * 14) is None  # a first round includes Ray's start
    for _ in range(6):  # later rounds: 1 s each
        timer.observe_round(1.0)
    # queued runs: start-up 21 - 1 = 20 s, then 30 rounds
    left = timer.eta([26, 26], [30] * 14)
    assert left == pytest.approx((52 + 14 * (20 + 30)) / 2) and _fmt_eta(left) == "6m16s"
    old = (16 * 30 - 8) * (21 + 3) / 8  # the former formula at the same moment
    assert old > 3 * left
    # the tail: one run left in flight, nothing queued -> its own rounds
    assert timer.eta([10], []) == pytest.approx(10.0)
    assert timer.eta([], []) == 0.0
    # once runs have finished, their whole overhead counts: 30 rounds in a 72 s run =
    # 42 s of overhead, 20 s of start-up and an end of 22 s (results, teardown)
    timer.observe_finish(72.0, 30)
    timer.observe_finish(72.0, 30)
    assert timer.eta([10, 10], [30] * 2) == pytest.approx((2 * (10 + 22) + 2 * (42 + 30)) / 2)
    assert timer.eta([10], []) == pytest.approx(10 + 22)
