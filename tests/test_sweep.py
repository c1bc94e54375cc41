"""Sweep files: expansion, naming, up-front validation, dry run; and (marked ``flwr``) a
sweep killed by SIGTERM and rerun: finished runs skipped, the checkpointed run resumed
(ending identical to an uninterrupted run), a stale attempt restarted."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.results import read_metrics
from fedrcl_flwr.runner import LOCK_FILE, procs_with
from fedrcl_flwr.sweep import plan_sweep

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "name": "tiny_sweep", "seed": 0,
    "dataset": {"name": "synthetic", "synthetic": {
        "num_train": 800, "num_test": 300, "num_classes": 4, "image_size": 16,
        "channels": 3, "subclusters": 2}},
    "partition": {"scheme": "dirichlet", "alpha": 0.5, "balanced": True},
    "model": {"name": "cnn5"},
    "federation": {"num_clients": 6, "rounds": 3, "participation": None,
                   "clients_per_round": 2},
    "client": {"method": "fedavg", "lr": 0.05, "local_epochs": 1, "batch_size": 32,
               "device": "cpu"},
    "server": {"strategy": "fedavg"},
    "evaluation": {"target_rounds": [2]},
}


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _sweep(tmp_path, **spec) -> Path:
    _write(tmp_path / "base.yaml", BASE)
    spec.setdefault("base", "base.yaml")
    return _write(tmp_path / "sweep.yaml", spec)


def test_grid_times_seeds_names_and_overrides(tmp_path):
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedrcl"],
                                "partition.alpha": [0.3, 1.0]}, seeds=[0, 1])
    runs, out = plan_sweep(sw, tmp_path / "out")
    assert out == (tmp_path / "out").resolve()
    assert len(runs) == 8
    names = [r.name for r in runs]
    assert names[0] == "method=fedavg_alpha=0.3_seed=0"
    assert names[-1] == "method=fedrcl_alpha=1.0_seed=1"
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
    sw = _write(tmp_path / "sweeps" / "s.yaml", {
        "base": "exp/base.yaml",  # relative to the working directory, not the sweep file
        "variants": [{"label": "fedavg", "client.method": "fedavg"},
                     {"label": "fedprox-mu0.01", "client.method": "fedprox",
                      "client.params": {"mu": 0.01}}],
        "seeds": [3], "set": {"federation.rounds": 2}})
    monkeypatch.chdir(tmp_path)
    runs, _ = plan_sweep(sw, tmp_path / "o")
    assert [r.name for r in runs] == ["fedavg", "fedprox-mu0.01"]  # seed does not vary
    assert runs[1].cfg.client.params == {"mu": 0.01} and runs[1].cfg.seed == 3
    assert runs[0].cfg.client.params == {} and runs[0].cfg.federation.rounds == 2


def test_variants_without_labels_are_named_by_their_values(tmp_path):
    sw = _sweep(tmp_path, variants=[{"client.method": "fedavg"},
                                    {"client.method": "fedprox",
                                     "client.params": {"mu": 0.01}}])
    runs, _ = plan_sweep(sw, tmp_path / "o")
    assert [r.name for r in runs] == ["method=fedavg_client.params=none",
                                      "method=fedprox_client.params=mu-0.01"]


def test_several_bases_are_a_setting_axis(tmp_path):
    _write(tmp_path / "a.yaml", BASE)
    _write(tmp_path / "b.yaml", {**BASE, "partition": {"scheme": "iid"}})
    sw = _write(tmp_path / "s.yaml", {"base": ["a.yaml", "b.yaml"],
                                      "grid": {"client.method": ["fedavg", "fedrcl"]}})
    runs, _ = plan_sweep(sw, tmp_path / "o")
    assert [r.name for r in runs] == ["a_method=fedavg", "a_method=fedrcl",
                                      "b_method=fedavg", "b_method=fedrcl"]
    assert runs[2].cfg.partition.scheme == "iid"


@pytest.mark.parametrize("spec,needle", [
    ({"grid": {"client.method": ["fedavg", "nope"]}}, "client.method"),
    ({"grid": {"partition.alpha": [0.3, -1]}}, "partition.alpha"),
    ({"grid": {"partition.nonsense": [1]}}, "partition.nonsense"),
    ({"variants": [{"client.method": "fedprox", "client.params": {"bogus": 1}}]},
     "client.params"),
    ({"grid": {"client.method": "fedavg"}}, "grid.client.method"),
    ({"seeds": [0, 0]}, "seeds"),
    ({"variants": [{"label": "x"}, {"client.method": "fedavg"}]}, "label"),
    ({"gird": {}}, "gird"),
    ({"base": "missing.yaml"}, "missing.yaml"),
])
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
    (out / "method=fedavg_seed=1").mkdir(parents=True)
    (out / "method=fedavg_seed=1" / "summary.json").write_text("{}")
    assert main(["sweep", str(sw), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("4 runs")
    assert "method=fedrcl_seed=0  [new]" in text
    assert "method=fedavg_seed=1  [done]" in text
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
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")}
            for r in recs]


@pytest.mark.flwr
def test_sweep_killed_by_sigterm_and_rerun_equals_uninterrupted(tmp_path):
    """Three runs, one at a time: ``a`` finished already (its directory made by hand, as a
    finished run leaves it), ``c`` started once but never checkpointed (a stale attempt),
    ``b`` really run and stopped by SIGTERM once round 1 is checkpointed. The rerun skips
    ``a``, resumes ``b`` and starts ``c`` afresh (clearing its stale files); ``b`` ends with
    the metrics of an uninterrupted run of the same configuration (in-process, the same
    computation as Flower's: the clients and the strategy are the same objects, driven
    round by round), ``c`` with exactly its own rounds. (Two real runs and a resume, not
    the eight of a paper-table grid: the suite's time budget.)"""
    import torch

    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import dump_config, load_config
    from fedrcl_flwr.results import write_marker

    # rounds of ~1.5 s on an idle CPU: the kill lands while b is part-way
    sw = _sweep(tmp_path, variants=[{"label": "a", "client.method": "fedavg"},
                                    {"label": "b", "client.method": "fedrcl"},
                                    {"label": "c", "client.method": "fedavg",
                                     "client.lr": 0.02, "federation.rounds": 1}],
                set={"dataset.synthetic.num_train": 1200, "dataset.synthetic.image_size": 32,
                     "client.local_epochs": 3})
    out = tmp_path / "out"
    runs, _ = plan_sweep(sw, out)
    a, b, c = runs
    for r, files in ((a, {"summary.json": '{"final_accuracy": 0.25}',
                          "metrics.jsonl": '{"round": 3, "test_accuracy": 0.25}\n'}),
                     (c, {"metrics.jsonl": '{"round": 1, "test_accuracy": 0.99}\n',
                          "flower.log": "stale"})):
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
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path, env=env)
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if b.state() == "resume":  # round 1 (of 3) checkpointed: two rounds of margin
            break
        time.sleep(0.1)
    assert proc.poll() is None, "sweep ended before it could be killed:\n" + proc.stdout.read()
    homes = [ln for ln in (b.out_dir / LOCK_FILE).read_text().splitlines()[1:] if ln]
    proc.send_signal(signal.SIGTERM)
    first, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, first
    # a Ray agent of a run stopped during its start-up can take over 10 s to exit
    deadline = time.time() + 30
    while (left := procs_with(f"FEDRCL_TEST_TAG={tag}") + [
            p for h in homes for p in procs_with(h)]) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"runs left processes behind: {left}"
    assert [r.state() for r in runs] == ["done", "resume", "new"], first
    status = json.loads((out / "sweep_status.json").read_text())
    assert status["b"]["status"] == "interrupted" and "c" not in status, status

    res = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 finished already, 2 to run" in res.stdout
    assert "run 2/3 b: resuming after round" in res.stdout
    assert "run 3/3 c: started" in res.stdout
    # one progress line per finished round: run i/N, name, round, accuracy, ETA
    assert any(line.startswith("run 2/3 b") and "round 3/3" in line and "acc " in line
               and "ETA " in line for line in res.stdout.splitlines())
    assert (a.out_dir / "summary.json").stat().st_mtime_ns == mtime  # not run again
    status = json.loads((out / "sweep_status.json").read_text())
    assert {v["status"] for v in status.values()} == {"done"} and len(status) == 3
    assert not (c.out_dir / "flower.log").read_text().startswith("stale")
    assert [x["round"] for x in read_metrics(c.out_dir)] == [1]  # its own round only

    torch.set_num_threads(1)  # as the ClientApp / ServerApp (simulation.num_cpus = 1)
    got = read_metrics(b.out_dir)
    assert [x["round"] for x in got] == [1, 2, 3]  # every round exactly once
    ref_dir = tmp_path / "ref" / "b"
    cfg = load_config(b.out_dir / "config.yaml", [f"output.dir={ref_dir}"])
    run_inprocess(cfg, ref_dir)
    assert _strip(got) == _strip(read_metrics(ref_dir))
    assert json.loads((b.out_dir / "summary.json").read_text())["final_accuracy"] == \
        json.loads((ref_dir / "summary.json").read_text())["final_accuracy"]


# ------------------------------------------------------------- the paper tables' sweeps

SWEEPS = sorted((ROOT / "experiments" / "sweeps").glob("*.yaml"))


def test_a_sweep_file_per_paper_table():
    names = {p.stem for p in SWEEPS}
    want = {f"fedrcl_table{t}" for t in ("1", "2", "3", "4", "5", "A", "C", "D")} | \
        {"univarfl_table1", "univarfl_table2", "synthetic_cpu", "fedccl_figure5",
         "fedccl_figure6"} | {f"fedccl_table{t}" for t in range(1, 9)}
    assert want <= names, want - names


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_paper_sweep_expands_validates_and_finds_its_paper_values(path, capsys):
    """What --dry-run does (plan + validate every run), and every run of a table sweep
    finds the paper's number for its row and column in its reference."""
    from fedrcl_flwr.config import to_dict
    from fedrcl_flwr.tables import Group, Run, paper_value

    assert main(["sweep", str(path), "--dry-run", "--out", "/nonexistent/sweep"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("runs -> /nonexistent/sweep")
    runs, _ = plan_sweep(path, "/nonexistent/sweep")
    seeds = {r.cfg.seed for r in runs}
    if path.stem == "synthetic_cpu":
        assert len(runs) == 8 and all(r.cfg.dataset.name == "synthetic" for r in runs)
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
    sw = _sweep(tmp_path, grid={"simulation.num_gpus": [0.0, 1.0]})
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "fedrcl_flwr.cli", "sweep", str(sw),
                          "--out", str(out)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "run 'num_gpus=1.0'" in res.stderr and "no CUDA GPU" in res.stderr
    assert "Traceback" not in res.stderr and not (out / "num_gpus=0.0").exists()


@pytest.mark.flwr
def test_failed_runs_are_recorded_and_the_sweep_goes_on(tmp_path):
    """A run whose every client fails (fault injection) fails at run time: recorded as
    failed with its first client error, the other run still completes, exit 1."""
    sw = _sweep(tmp_path, variants=[
        {"label": "broken", "client.method": "faulty",
         "client.params": {"mode": "raise", "partitions": [-1]}},
        {"label": "fine", "client.method": "fedavg"}],
        set={"federation.rounds": 1})
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "fedrcl_flwr.cli", "sweep", str(sw),
                          "--out", str(out)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    status = json.loads((out / "sweep_status.json").read_text())
    assert sorted(status) == ["broken", "fine"], status
    assert status["broken"]["status"] == "failed" and status["broken"]["exit_code"] == 1
    assert "injected" in status["broken"]["error"], status["broken"]
    assert status["fine"]["status"] == "done"
    assert res.stderr.count("FAILED") == 1 and "Traceback" not in res.stderr
    assert "1/2 runs finished, 1 failed" in res.stdout
