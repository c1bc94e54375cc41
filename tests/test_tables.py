"""``report`` / ``plot`` on hand-written run directories (arithmetic of mean ± std, paper
references, metrics computed from metrics.jsonl, bad files) and the paper YAMLs'
``reference`` blocks."""

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.config import check_reference, load_config
from fedrcl_flwr.tables import build_table, method_label, metric_value, load_runs

ROOT = Path(__file__).resolve().parents[1]

REFERENCE = [
    {"source": "Paper T1", "metric": "final", "when": {"partition.alpha": 0.05},
     "values": {"fedavg": 51.0, "fedrcl": 65.0}},
    {"source": "Paper T1", "metric": "final", "when": {"partition.alpha": 0.3},
     "values": {"fedavg": 71.5}},
]


def _run(root: Path, name: str, method: str, alpha: float, seed: int, *, final=None,
         records=None, summary_extra=None, reference=REFERENCE, strategy="fedavg"):
    d = root / name
    d.mkdir(parents=True)
    cfg = {"name": "t", "seed": seed, "partition": {"scheme": "dirichlet", "alpha": alpha},
           "client": {"method": method, "params": {}}, "server": {"strategy": strategy},
           "output": {"dir": str(d)}, "reference": reference}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if final is not None:
        s = {"method": method, "strategy": strategy, "rounds": 3, "final_accuracy": final,
             "accuracy_at": {}}
        s.update(summary_extra or {})
        (d / "summary.json").write_text(json.dumps(s))
    if records is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


@pytest.fixture
def table_dirs(tmp_path):
    out = tmp_path / "sweep"
    for seed, acc in enumerate([0.50, 0.52, 0.54]):
        _run(out, f"fedavg_a0.05_s{seed}", "fedavg", 0.05, seed, final=acc)
    for seed, acc in enumerate([0.60, 0.64]):
        _run(out, f"fedrcl_a0.05_s{seed}", "fedrcl", 0.05, seed, final=acc)
    _run(out, "fedavg_a0.3_s0", "fedavg", 0.3, 0, final=0.70)
    for seed, acc in enumerate([0.80, 0.90]):
        _run(out, f"fedrcl_a0.3_s{seed}", "fedrcl", 0.3, seed, final=acc)
    (out / "_configs").mkdir()  # what a sweep leaves beside its runs: not runs
    (out / "_configs" / "x.yaml").write_text("name: x\n")
    (out / "_logs").mkdir()
    return out


def test_groups_mean_sample_std_and_paper(table_dirs):
    groups, metric = build_table([table_dirs])
    assert metric == "final"  # from the runs' reference
    by = {(g.row, g.col): g for g in groups}
    assert set(by) == {("fedavg", "alpha=0.05"), ("fedrcl", "alpha=0.05"),
                       ("fedavg", "alpha=0.3"), ("fedrcl", "alpha=0.3")}
    g = by[("fedavg", "alpha=0.05")]
    assert g.n == 3 and g.mean == pytest.approx(0.52) and g.std == pytest.approx(0.02)
    assert g.paper == pytest.approx(0.51) and g.diff == pytest.approx(0.01)
    g = by[("fedrcl", "alpha=0.05")]
    assert g.std == pytest.approx(math.sqrt(2 * 0.02 ** 2))  # sample std, ddof = 1
    assert g.paper == pytest.approx(0.65)
    assert by[("fedavg", "alpha=0.3")].std is None  # one run: no spread
    assert by[("fedrcl", "alpha=0.3")].paper is None  # the 0.3 block has no fedrcl


def test_markdown(table_dirs, capsys):
    assert main(["report", str(table_dirs)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == ("| method | alpha=0.05 | alpha=0.05 paper | alpha=0.05 diff | "
                        "alpha=0.3 | alpha=0.3 paper | alpha=0.3 diff |")
    assert "| fedavg | 52.00 ± 2.00 (n=3) | 51.00 | +1.00 | 70.00 (n=1) | 71.50 | -1.50 |" \
        in lines
    assert "| fedrcl | **62.00 ± 2.83 (n=2)** | 65.00 | -3.00 | **85.00 ± 7.07 (n=2)** |  |  |" \
        in lines
    assert "Paper T1" in text


def test_csv_one_row_per_group(table_dirs, capsys):
    assert main(["report", str(table_dirs), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 4
    r = next(r for r in rows if r["method"] == "fedrcl" and r["setting"] == "alpha=0.3")
    assert (r["n"], r["mean"], r["std"], r["best"], r["paper"]) == ("2", "85.00", "7.07", "1",
                                                                     "")
    r = next(r for r in rows if r["method"] == "fedavg" and r["setting"] == "alpha=0.05")
    assert (r["n"], r["mean"], r["std"], r["paper"], r["diff"], r["metric"]) == \
        ("3", "52.00", "2.00", "51.00", "+1.00", "final")
    assert len(r["runs"].split(";")) == 3


def test_latex(table_dirs, capsys):
    assert main(["report", str(table_dirs), "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    assert tex.startswith("\\begin{tabular}{lrrrrrr}")
    assert r"fedavg & $52.00 \pm 2.00$ & 51.00 & $+1.00$ & $70.00$ & 71.50 & $-1.50$ \\" in tex
    assert r"fedrcl & $\mathbf{62.00 \pm 2.83}$ & 65.00 & $-3.00$ & " \
           r"$\mathbf{85.00 \pm 7.07}$ &  &  \\" in tex
    assert r"\end{tabular}" in tex


def _recs(accs, rounds=None):
    rounds = rounds or list(range(1, len(accs) + 1))
    out, ema = [], None
    for r, a in zip(rounds, accs):
        ema = a if ema is None else 0.9 * ema + 0.1 * a
        out.append({"round": r, "test_accuracy": a, "ema_accuracy": ema})
    return out


def test_metrics_from_metrics_jsonl_when_summary_lacks_them(tmp_path):
    accs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.45]
    d = _run(tmp_path, "r", "fedavg", 0.3, 0, records=_recs(accs, [1, 3, 5, 7, 9, 11, 13]),
             reference=None)
    run = load_runs([d])[0]
    assert metric_value(run, "final") == pytest.approx(0.45)
    assert metric_value(run, "best") == pytest.approx(0.6)
    assert metric_value(run, "last5") == pytest.approx((0.3 + 0.4 + 0.5 + 0.6 + 0.45) / 5)
    ema = _recs(accs)
    assert metric_value(run, "ema@4") == pytest.approx(ema[1]["ema_accuracy"])  # round 3
    assert metric_value(run, "ema@13") == pytest.approx(ema[-1]["ema_accuracy"])
    assert metric_value(run, "ema@14") is None  # never reached round 14
    # summary values win where present (the recorder's own figures)
    (d / "summary.json").write_text(json.dumps(
        {"final_accuracy": 0.9, "last5": 0.8, "rounds": 13, "accuracy_at": {"4": 0.7}}))
    run = load_runs([d])[0]
    assert metric_value(run, "final") == 0.9 and metric_value(run, "last5") == 0.8
    assert metric_value(run, "ema@4") == 0.7


def test_unreached_target_round_is_missing(tmp_path, capsys):
    # summary.json's accuracy_at may name a target the run never reached (older recorder)
    _run(tmp_path, "a", "fedavg", 0.3, 0, final=0.5, records=_recs([0.4, 0.5]),
         summary_extra={"rounds": 2, "accuracy_at": {"5": 0.41}}, reference=None)
    _run(tmp_path, "b", "fedavg", 0.3, 1, final=0.6, records=_recs([0.5, 0.5, 0.5, 0.5, 0.6]),
         summary_extra={"rounds": 5}, reference=None)
    assert main(["report", str(tmp_path), "--metric", "ema@5"]) == 0
    out = capsys.readouterr().out
    want = 0.9 ** 4 * 0.5 + sum(0.1 * 0.9 ** (4 - i) * a
                                for i, a in enumerate([0.5, 0.5, 0.5, 0.5, 0.6]) if i > 0)
    assert f"{100 * want:.2f} (n=1, 1 missing)" in out
    assert main(["report", str(tmp_path / "a"), "--metric", "ema@5"]) == 0
    assert "| fedavg | missing |" in capsys.readouterr().out


def test_default_metric_from_summary_report_metric(tmp_path):
    _run(tmp_path, "a", "fedavg", 0.3, 0, final=0.5, records=_recs([0.1, 0.5]),
         summary_extra={"report_metric": "best", "best_accuracy": 0.55})
    groups, metric = build_table([tmp_path])
    assert metric == "best" and groups[0].mean == pytest.approx(0.55)
    groups, metric = build_table([tmp_path], "final")
    assert metric == "final" and groups[0].mean == pytest.approx(0.5)


def test_rows_of_one_method_with_different_params_and_server_optimizers(tmp_path):
    ref = [{"source": "S", "metric": "final", "when": {"client.params": {"mu": 0.1}},
            "values": {"fedprox": 40.0}},
           {"source": "S", "metric": "final", "values": {"fedadam+fedrcl": 30.0}}]
    for i, mu in enumerate([0.01, 0.1]):
        d = _run(tmp_path, f"p{i}", "fedprox", 0.3, 0, final=0.3 + i / 10, reference=ref)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["client"]["params"] = {"mu": mu}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    _run(tmp_path, "s", "fedrcl", 0.3, 0, final=0.2, reference=ref, strategy="fedadam")
    groups, _ = build_table([tmp_path])
    rows = {g.row: g for g in groups}
    assert set(rows) == {"fedprox [mu=0.01]", "fedprox [mu=0.1]", "fedadam+fedrcl"}
    assert rows["fedprox [mu=0.1]"].paper == pytest.approx(0.4)
    assert rows["fedprox [mu=0.01]"].paper is None
    assert rows["fedadam+fedrcl"].paper == pytest.approx(0.3)


@pytest.mark.parametrize("name,content,needle", [
    ("summary.json", "{not json", "not valid JSON"),
    ("summary.json", "[1, 2]", "must be a JSON object"),
    ("summary.json", '{"final_accuracy": "high"}', "final_accuracy"),
    ("summary.json", '{"accuracy_at": [1]}', "accuracy_at"),
    ("metrics.jsonl", '{"round": 1, "test_accuracy": 0.1}\nxx\n{"round": 3}\n', "line 2"),
    ("metrics.jsonl", '{"test_accuracy": 0.1}\n', "line 1"),
    ("metrics.jsonl", '{"round": 1, "test_accuracy": "0.1"}\n', "test_accuracy"),
    ("config.yaml", "reference: {source: x, metric: top1, values: {a: 1}}\n",
     "reference.metric"),
])
def test_bad_run_files_are_one_line_exit_2(tmp_path, name, content, needle):
    d = tmp_path / "run"
    d.mkdir()
    if name != "summary.json":
        (d / "summary.json").write_text('{"final_accuracy": 0.5}')
    (d / name).write_text(content)
    res = subprocess.run([sys.executable, "-m", "fedrcl_flwr.cli", "report", str(d)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert needle in res.stderr and str(d / name) in res.stderr


def test_torn_last_metrics_line_is_tolerated(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"round": 1, "test_accuracy": 0.25}\n{"round": 2, "te')
    groups, _ = build_table([d])
    assert groups[0].mean == 0.25


def test_bad_metric_and_empty_dir_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--metric", "ema500"]) == 2
    assert main(["report", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_plot_writes_png_and_pdf(table_dirs, tmp_path):
    for d in table_dirs.iterdir():
        if d.name.startswith("fed"):
            seed = int(d.name[-1])
            (d / "metrics.jsonl").write_text("".join(
                json.dumps(r) + "\n" for r in _recs([0.2 + seed / 10, 0.4, 0.5])))
    assert main(["plot", str(table_dirs), "--out", str(tmp_path / "fig" / "curves")]) == 0
    for ext in ("png", "pdf"):
        p = tmp_path / "fig" / f"curves.{ext}"
        assert p.stat().st_size > 5000, p
    from PIL import Image

    w, h = Image.open(tmp_path / "fig" / "curves.png").size
    assert w > 2 * h  # two setting panels side by side


# ------------------------------------------------------------------ paper references


PAPER_YAMLS = sorted(p for p in (ROOT / "experiments").glob("*/*.yaml")
                     if p.parent.name in ("fedrcl", "univarfl", "fedccl")
                     and p.name.startswith("table"))


def test_every_paper_yaml_is_found():
    assert len(PAPER_YAMLS) >= 80


@pytest.mark.parametrize("path", PAPER_YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_paper_yaml_has_a_reference_for_its_own_row(path):
    from fedrcl_flwr.tables import Group, Run, paper_value

    cfg = load_config(path)
    blocks = check_reference(cfg.reference, str(path))
    assert blocks, f"{path}: no reference"
    paper = {"fedrcl": "FedRCL", "univarfl": "UniVarFL", "fedccl": "FedCCL"}[path.parent.name]
    assert all(b["source"].startswith(paper + " Table") for b in blocks)
    raw = yaml.safe_load(path.read_text())
    from fedrcl_flwr.config import to_dict

    resolved = to_dict(cfg)
    g = Group("k", [Run(path, resolved, {}, [])], resolved)
    value, source = paper_value(g, blocks[0]["metric"] if path.parent.name != "fedrcl"
                                else "ema@1000")
    assert value is not None, f"{path}: no paper value for {method_label(resolved)}"
    assert 0 < value <= 1 and source
    assert raw["reference"] == cfg.reference


def test_sweep_dir_with_runs_not_started_yet(table_dirs, capsys):
    (table_dirs / "fedavg_a0.3_s1").mkdir()
    (table_dirs / "fedavg_a0.3_s1" / "config.yaml").write_text("name: t\n")
    assert main(["report", str(table_dirs)]) == 0
    captured = capsys.readouterr()
    assert "| fedavg | 52.00 ± 2.00 (n=3)" in captured.out
    assert "1 run dir(s) without an evaluated round" in captured.err
    assert main(["report", str(table_dirs / "fedavg_a0.3_s1")]) == 2
