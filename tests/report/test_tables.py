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

import numpy as np
import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.config import check_reference, load_config
from fedrcl_flwr.report.grouping import build_table
from fedrcl_flwr.report.metrics import metric_value
from fedrcl_flwr.report.reading import load_runs, method_label

ROOT = Path(__file__).resolve().parents[2]

REFERENCE = [
    {
        "source": "Paper T1",
        "metric": "final",
        "when": {"partition.alpha": 0.05},
        "values": {"fedavg": 51.0, "fedrcl": 65.0},
    },
    {
        "source": "Paper T1",
        "metric": "final",
        "when": {"partition.alpha": 0.3},
        "values": {"fedavg": 71.5},
    },
]


def _run(
    root: Path,
    name: str,
    method: str,
    alpha: float,
    seed: int,
    *,
    final=None,
    records=None,
    summary_extra=None,
    reference=REFERENCE,
    strategy="fedavg",
):
    d = root / name
    d.mkdir(parents=True)
    cfg = {
        "name": "t",
        "seed": seed,
        "partition": {"scheme": "dirichlet", "alpha": alpha},
        "client": {"method": method, "params": {}},
        "server": {"strategy": strategy},
        "output": {"dir": str(d)},
        "reference": reference,
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if final is not None:
        s = {
            "method": method,
            "strategy": strategy,
            "rounds": 3,
            "final_accuracy": final,
            "accuracy_at": {},
        }
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
    assert set(by) == {
        ("fedavg", "alpha=0.05"),
        ("fedrcl", "alpha=0.05"),
        ("fedavg", "alpha=0.3"),
        ("fedrcl", "alpha=0.3"),
    }
    g = by[("fedavg", "alpha=0.05")]
    assert g.n == 3 and g.mean == pytest.approx(0.52) and g.std == pytest.approx(0.02)
    assert g.paper == pytest.approx(0.51) and g.diff == pytest.approx(0.01)
    g = by[("fedrcl", "alpha=0.05")]
    assert g.std == pytest.approx(math.sqrt(2 * 0.02**2))  # sample std, ddof = 1
    assert g.paper == pytest.approx(0.65)
    assert by[("fedavg", "alpha=0.3")].std is None  # one run: no spread
    assert by[("fedrcl", "alpha=0.3")].paper is None  # the 0.3 block has no fedrcl


def test_markdown(table_dirs, capsys):
    assert main(["report", str(table_dirs)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "**Dirichlet** (final)"  # what every run shares: α varies
    assert lines[2] == (
        "| method | alpha=0.05 | alpha=0.05 paper | alpha=0.05 diff | "
        "alpha=0.3 | alpha=0.3 paper | alpha=0.3 diff |"
    )
    assert "| fedavg | 52.00 ± 2.00 (n=3) | 51.00 | +1.00 | 70.00 (n=1) | 71.50 | -1.50 |" in lines
    assert (
        "| fedrcl | **62.00 ± 2.83 (n=2)** | 65.00 | -3.00 | **85.00 ± 7.07 (n=2)** |  |  |"
        in lines
    )
    assert "Paper T1" in text


def test_csv_one_row_per_group(table_dirs, capsys):
    assert main(["report", str(table_dirs), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 4
    r = next(r for r in rows if r["method"] == "fedrcl" and r["setting"] == "alpha=0.3")
    assert (r["n"], r["mean"], r["std"], r["best"], r["paper"]) == ("2", "85.00", "7.07", "1", "")
    r = next(r for r in rows if r["method"] == "fedavg" and r["setting"] == "alpha=0.05")
    assert (r["n"], r["mean"], r["std"], r["paper"], r["diff"], r["metric"]) == (
        "3",
        "52.00",
        "2.00",
        "51.00",
        "+1.00",
        "final",
    )
    assert len(r["runs"].split(";")) == 3


def test_latex(table_dirs, capsys):
    assert main(["report", str(table_dirs), "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    assert tex.startswith("\\begin{tabular}{lrrrrrr}")
    assert r"fedavg & $52.00 \pm 2.00$ & 51.00 & $+1.00$ & $70.00$ & 71.50 & $-1.50$ \\" in tex
    assert (
        r"fedrcl & $\mathbf{62.00 \pm 2.83}$ & 65.00 & $-3.00$ & "
        r"$\mathbf{85.00 \pm 7.07}$ &  &  \\" in tex
    )
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
    d = _run(
        tmp_path,
        "r",
        "fedavg",
        0.3,
        0,
        records=_recs(accs, [1, 3, 5, 7, 9, 11, 13]),
        reference=None,
    )
    run = load_runs([d])[0]
    assert metric_value(run, "final") == pytest.approx(0.45)
    assert metric_value(run, "best") == pytest.approx(0.6)
    assert metric_value(run, "last5") == pytest.approx((0.3 + 0.4 + 0.5 + 0.6 + 0.45) / 5)
    ema = _recs(accs)
    assert metric_value(run, "ema@4") == pytest.approx(ema[1]["ema_accuracy"])  # round 3
    assert metric_value(run, "ema@13") == pytest.approx(ema[-1]["ema_accuracy"])
    assert metric_value(run, "ema@14") is None  # never reached round 14
    # summary values win where present (the recorder's own figures)
    (d / "summary.json").write_text(
        json.dumps({"final_accuracy": 0.9, "last5": 0.8, "rounds": 13, "accuracy_at": {"4": 0.7}})
    )
    run = load_runs([d])[0]
    assert metric_value(run, "final") == 0.9 and metric_value(run, "last5") == 0.8
    assert metric_value(run, "ema@4") == 0.7


def test_unreached_target_round_is_missing(tmp_path, capsys):
    # summary.json's accuracy_at may name a target the run never reached (older recorder)
    _run(
        tmp_path,
        "a",
        "fedavg",
        0.3,
        0,
        final=0.5,
        records=_recs([0.4, 0.5]),
        summary_extra={"rounds": 2, "accuracy_at": {"5": 0.41}},
        reference=None,
    )
    _run(
        tmp_path,
        "b",
        "fedavg",
        0.3,
        1,
        final=0.6,
        records=_recs([0.5, 0.5, 0.5, 0.5, 0.6]),
        summary_extra={"rounds": 5},
        reference=None,
    )
    assert main(["report", str(tmp_path), "--metric", "ema@5"]) == 0
    out = capsys.readouterr().out
    want = 0.9**4 * 0.5 + sum(
        0.1 * 0.9 ** (4 - i) * a for i, a in enumerate([0.5, 0.5, 0.5, 0.5, 0.6]) if i > 0
    )
    assert f"{100 * want:.2f} (n=1, 1 missing)" in out
    assert main(["report", str(tmp_path / "a"), "--metric", "ema@5"]) == 0
    assert "| fedavg | missing |" in capsys.readouterr().out


def test_default_metric_from_summary_report_metric(tmp_path):
    _run(
        tmp_path,
        "a",
        "fedavg",
        0.3,
        0,
        final=0.5,
        records=_recs([0.1, 0.5]),
        summary_extra={"report_metric": "best", "best_accuracy": 0.55},
    )
    groups, metric = build_table([tmp_path])
    assert metric == "best" and groups[0].mean == pytest.approx(0.55)
    groups, metric = build_table([tmp_path], "final")
    assert metric == "final" and groups[0].mean == pytest.approx(0.5)


def test_rows_of_one_method_with_different_params_and_server_optimizers(tmp_path):
    ref = [
        {
            "source": "S",
            "metric": "final",
            "when": {"client.params": {"mu": 0.1}},
            "values": {"fedprox": 40.0},
        },
        {"source": "S", "metric": "final", "values": {"fedadam+fedrcl": 30.0}},
    ]
    for i, mu in enumerate([0.01, 0.1]):
        d = _run(tmp_path, f"p{i}", "fedprox", 0.3, 0, final=0.3 + i / 10, reference=ref)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["client"]["params"] = {"mu": mu}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    _run(tmp_path, "s", "fedrcl", 0.3, 0, final=0.2, reference=ref, strategy="fedadam")
    groups, _ = build_table([tmp_path])
    rows = {g.row: g for g in groups}
    assert set(rows) == {"fedprox (mu=0.01)", "fedprox (mu=0.1)", "fedadam+fedrcl"}
    assert rows["fedprox (mu=0.1)"].paper == pytest.approx(0.4)
    assert rows["fedprox (mu=0.01)"].paper is None
    assert rows["fedadam+fedrcl"].paper == pytest.approx(0.3)


def test_report_resolves_method_defaults_from_the_class_and_only_then(tmp_path):
    """A paper reference's ``when: {client.params: ...}`` is compared with the run's
    parameters completed by the method's declared defaults (fedprox's mu = 0.001), which
    ``report`` reads from the method's class (``clients/fedprox.py``). Only such a
    reference imports the class: a report without one imports no client and no Flower
    (a fresh interpreter, so nothing else imported them before)."""
    plain = [{"source": "S", "metric": "final", "values": {"fedprox": 40.0}}]
    ref = [
        {
            "source": "S",
            "metric": "final",
            "when": {"client.params": {"mu": 0.001}},
            "values": {"fedprox": 40.0},
        }
    ]
    _run(tmp_path / "a", "plain", "fedprox", 0.3, 0, final=0.3, reference=plain)
    _run(tmp_path / "b", "default_mu", "fedprox", 0.3, 0, final=0.3, reference=ref)
    code = (
        "import sys; from fedrcl_flwr.report.grouping import build_table\n"
        "def loaded(): return sorted(m for m in sys.modules if m.split('.')[0] == 'flwr' "
        "or m.startswith('clients.'))\n"
        f"groups, _ = build_table([{str(tmp_path / 'a')!r}]); print(groups[0].paper); "
        "print(loaded())\n"
        f"groups, _ = build_table([{str(tmp_path / 'b')!r}]); print(groups[0].paper); "
        "print('clients.fedprox' in loaded())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    paper_a, imported_a, paper_b, fedprox_loaded = out.stdout.strip().splitlines()
    assert float(paper_a) == pytest.approx(0.4) and imported_a == "[]"
    assert float(paper_b) == pytest.approx(0.4)  # {} matched {mu: 0.001}: the default
    assert fedprox_loaded == "True"


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("summary.json", "{not json", "not valid JSON"),
        ("summary.json", "[1, 2]", "must be a JSON object"),
        ("summary.json", '{"final_accuracy": "high"}', "final_accuracy"),
        ("summary.json", '{"accuracy_at": [1]}', "accuracy_at"),
        (
            "metrics.jsonl",
            '{"round": 1, "test_accuracy": 0.1}\nxx\n{"round": 3}\n',
            "metrics.jsonl:2:",
        ),
        ("metrics.jsonl", '{"test_accuracy": 0.1}\n', "metrics.jsonl:1:"),
        ("metrics.jsonl", '{"round": 1, "test_accuracy": "0.1"}\n', "test_accuracy"),
        (
            "config.yaml",
            "reference: {source: x, metric: top1, values: {a: 1}}\n",
            "reference.metric",
        ),
    ],
)
def test_bad_run_files_are_one_line_exit_2(tmp_path, name, content, needle):
    d = tmp_path / "run"
    d.mkdir()
    if name != "summary.json":
        (d / "summary.json").write_text('{"final_accuracy": 0.5}')
    (d / name).write_text(content)
    res = subprocess.run(
        [sys.executable, "-m", "fedrcl_flwr.cli", "report", str(d)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
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
            (d / "metrics.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in _recs([0.2 + seed / 10, 0.4, 0.5]))
            )
    assert main(["plot", str(table_dirs), "--out", str(tmp_path / "fig" / "curves")]) == 0
    for ext in ("png", "pdf"):
        p = tmp_path / "fig" / f"curves.{ext}"
        assert p.stat().st_size > 5000, p
    from PIL import Image

    w, h = Image.open(tmp_path / "fig" / "curves.png").size
    assert w > 2 * h  # two setting panels side by side


# ------------------------------------------------------------------ paper references


PAPER_YAMLS = sorted(
    p
    for p in (ROOT / "experiments").glob("*/*.yaml")
    if p.parent.name in ("fedrcl", "univarfl", "fedccl") and p.name.startswith("table")
)


def test_every_paper_yaml_is_found():
    assert len(PAPER_YAMLS) >= 80


@pytest.mark.parametrize("path", PAPER_YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_paper_yaml_has_a_reference_for_its_own_row(path):
    from fedrcl_flwr.report.grouping import Group, paper_value
    from fedrcl_flwr.report.reading import Run

    cfg = load_config(path)
    blocks = check_reference(cfg.reference, str(path))
    assert blocks, f"{path}: no reference"
    paper = {"fedrcl": "FedRCL", "univarfl": "UniVarFL", "fedccl": "FedCCL"}[path.parent.name]
    assert all(b["source"].startswith(paper + " Table") for b in blocks)
    raw = yaml.safe_load(path.read_text())
    from fedrcl_flwr.config import to_dict

    resolved = to_dict(cfg)
    g = Group("k", [Run(path, resolved, {}, [])], resolved)
    value, source = paper_value(
        g, blocks[0]["metric"] if path.parent.name != "fedrcl" else "ema@1000"
    )
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


# ------------------------------------------- labels, titles, paired comparison

STUDY = {  # label -> (method, client.params, model.params, per-seed final accuracy by alpha)
    "fedavg": ("fedavg", {}, {}, {0.1: [0.90, 0.92, 0.93], 0.5: [0.95, 0.96, 0.96]}),
    "fedprox": ("fedprox", {"mu": 0.01}, {}, {0.1: [0.91, 0.92, 0.95], 0.5: [0.95, 0.95, 0.97]}),
    "univarfl_proj": (
        "univarfl",
        {},
        {"projector": 256},
        {0.1: [0.93, 0.96, 0.96], 0.5: [0.97, 0.97, 0.98]},
    ),
}


def _study_run(root: Path, label, method, params, model_params, alpha, seed, acc, curve=None):
    d = root / f"{label or method}_{alpha}_{seed}"
    d.mkdir(parents=True)
    cfg = {
        "name": "digits",
        "label": label,
        "seed": seed,
        "dataset": {"name": "npz", "path": "/data/sets/digits.npz"},
        "partition": {"scheme": "dirichlet", "alpha": alpha, "balanced": True},
        "model": {"name": "cnn5", "params": model_params},
        "federation": {"num_clients": 20, "clients_per_round": 5, "rounds": 30},
        "client": {"method": method, "params": params},
        "server": {"strategy": "fedavg"},
        "output": {"dir": str(d)},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "summary.json").write_text(json.dumps({"final_accuracy": acc}))
    if curve is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _recs(curve)))
    return d


@pytest.fixture
def study(tmp_path):
    out = tmp_path / "study"
    for label, (method, params, mp, accs) in STUDY.items():
        for alpha, values in accs.items():
            for seed, acc in enumerate(values):
                _study_run(out, label, method, params, mp, alpha, seed, acc)
    return out


def test_rows_are_sweep_labels_and_say_what_differs(study, capsys):
    """Labels were dropped (univarfl_proj showed as univarfl) and columns read
    `params={}, projector=None`; the title now names the data and the split."""
    assert main(["report", str(study)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == "**npz digits.npz, Dirichlet, 20 clients, 5 per round, 30 rounds** (final)"
    assert lines[2] == "| method | alpha=0.1 | alpha=0.5 |"
    assert [ln.split(" | ")[0] for ln in lines[4:7]] == ["| fedavg", "| fedprox", "| univarfl_proj"]
    assert "rows: fedprox = fedprox (mu=0.01); univarfl_proj = univarfl (projector=256)" in text
    assert "params" not in text and "None" not in text
    # without labels the same runs are named by method and what differs
    for cfg_file in study.rglob("config.yaml"):
        cfg = yaml.safe_load(cfg_file.read_text())
        cfg["label"] = None
        cfg_file.write_text(yaml.safe_dump(cfg))
    groups, _ = build_table([study])
    assert {g.row for g in groups} == {"fedavg", "fedprox (mu=0.01)", "univarfl (projector=256)"}
    assert {g.col for g in groups} == {"alpha=0.1", "alpha=0.5"}


def test_report_vs_gives_per_seed_paired_differences_and_a_t_interval(study, capsys):
    assert main(["report", str(study), "--vs", "fedavg"]) == 0
    text = capsys.readouterr().out
    # univarfl_proj at alpha 0.1: diffs +3, +4, +3 points; mean 3.3333, sample std 0.5774;
    # t(0.975, 2) = 4.302653: half-width 4.302653 * 0.57735 / sqrt(3) = 1.4342
    row = next(ln for ln in text.splitlines() if ln.startswith("| univarfl_proj | alpha=0.1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "0: +3.00, 1: +4.00, 2: +3.00"
    assert cells[3] == "+3.33 ± 0.58"
    assert cells[4] == "[+1.90, +4.77]"
    from scipy.stats import ttest_rel  # an independent computation of the same interval

    ci = ttest_rel([93, 96, 96], [90, 92, 93]).confidence_interval(0.95)
    assert cells[4] == f"[{ci.low:+.2f}, {ci.high:+.2f}]"
    assert cells[5] == "3"
    assert cells[6] == "95.00 ± 1.73 vs 91.67 ± 1.53"  # the unpaired means beside
    assert "Student-t" in text and "same seed" in text
    assert not any(
        ln.startswith("| fedavg | alpha") for ln in text[text.index("Paired with") :].splitlines()
    )  # the reference itself
    assert main(["report", str(study), "--vs", "fedavg", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    r = next(r for r in rows if r["method"] == "fedprox" and r["setting"] == "alpha=0.5")
    assert (r["vs"], r["paired_n"], r["paired_mean"], r["per_seed"]) == (
        "fedavg",
        "3",
        "+0.00",
        "0:+0.00;1:-1.00;2:+1.00",
    )
    assert (r["ci_low"], r["ci_high"]) == ("-2.48", "+2.48")  # 4.302653 * 1 / sqrt(3)
    assert next(r for r in rows if r["method"] == "fedavg")["paired_n"] == ""
    assert main(["report", str(study), "--vs", "scaffold"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a row" in err and "fedprox" in err


def test_plot_clips_bands_shares_the_y_range_and_names_the_setting(tmp_path):
    """Bands above 100 %, panels on different scales, FedAvg hidden under
    FedProx, a title saying "all runs"; and the partition heatmap's client ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrcl_flwr.report.figures import curves_figure
    from fedrcl_flwr.report.grouping import group_runs

    out = tmp_path / "s"
    same = [0.5, 0.8, 0.99]  # fedavg and fedprox identical: one would hide the other
    for alpha, lift in ((0.1, 0.0), (0.5, -0.3)):
        for seed, jitter in enumerate((0.0, 0.01, -0.01)):
            for label, method in (("fedavg", "fedavg"), ("fedprox", "fedprox")):
                _study_run(
                    out,
                    label,
                    method,
                    {},
                    {},
                    alpha,
                    seed,
                    0.9,
                    curve=[max(a + lift + jitter, 0.0) for a in same],
                )
            _study_run(
                out,
                "wild",
                "fedrcl",
                {},
                {},
                alpha,
                seed,
                0.9,
                curve=[0.98 + 0.02 * (seed == 0), 0.99, 1.0 - 0.5 * (seed == 2)],
            )
    fig = curves_figure(group_runs(load_runs([out])))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert axes[0].get_ylim() == axes[1].get_ylim()  # one scale for every panel
    assert 0.0 <= axes[0].get_ylim()[0] and axes[0].get_ylim()[1] <= 100.0
    for ax in axes:
        for band in ax.collections:
            ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
            assert ys.min() >= 0.0 and ys.max() <= 100.0
        looks = {
            (
                ln.get_color() if isinstance(ln.get_color(), str) else tuple(ln.get_color()),
                ln.get_linestyle(),
                ln.get_marker(),
            )
            for ln in ax.get_lines()
        }
        assert len(looks) == 3  # three rows, three looks
        assert ax.get_title() in ("alpha=0.1", "alpha=0.5")
        assert all(float(t).is_integer() for t in ax.get_xticks())  # rounds
    title = fig._suptitle.get_text()
    assert "npz digits.npz" in title and "Dirichlet" in title and "all runs" not in title
    plt.close(fig)


def test_partition_heatmap_has_integer_client_ticks_and_alpha_in_its_title(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrcl_flwr.data import report as data_report

    counts = np.arange(7 * 4).reshape(7, 4)
    fig = data_report.counts_heatmap_figure(counts, title="x")
    ax = fig.axes[0]
    for ticks in (ax.get_yticks(), ax.get_xticks()):
        shown = [t for t in ticks if -0.5 <= t <= 6.5]
        assert shown and all(float(t).is_integer() for t in shown), ticks
    plt.close(fig)
    titles = []
    real = data_report.plot_counts_heatmap
    monkeypatch.setattr(
        data_report,
        "plot_counts_heatmap",
        lambda counts, path, title="", domains=None: (
            titles.append(title),
            real(counts, path, title, domains),
        ),
    )
    exp = tmp_path / "exp.yaml"
    from helpers import tiny_config

    from fedrcl_flwr.config import to_dict

    exp.write_text(
        yaml.safe_dump(
            to_dict(
                tiny_config(
                    tmp_path, partition={"scheme": "dirichlet", "alpha": 0.1, "balanced": True}
                )
            )
        )
    )
    assert main(["partition", str(exp), "--plot", str(tmp_path / "h.png")]) == 0
    assert titles and "α=0.1" in titles[0] and "8 clients" in titles[0], titles
