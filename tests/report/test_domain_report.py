"""Inter-domain reports: the domain mean (the papers' "Avg") as the reported metric, a
column per domain as FedCCL's Tables 1-2 and RethinkFL's tables lay them out, paired
intervals on the domain mean, several baselines, per-domain curves. Hand-written run
directories whose numbers have closed forms."""

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.report.grouping import build_table
from fedrcl_flwr.report.metrics import metric_value
from fedrcl_flwr.report.reading import load_runs

# per method: domain -> per-seed accuracy of every round (constant over rounds)
ACC = {
    "fedavg": {"mnist": [0.90, 0.92, 0.94], "svhn": [0.30, 0.32, 0.34]},
    "fpl": {"mnist": [0.91, 0.93, 0.95], "svhn": [0.40, 0.44, 0.42]},
    "fedccl": {"mnist": [0.89, 0.90, 0.91], "svhn": [0.36, 0.36, 0.36]},
}
# svhn's test set is nine times mnist's: the pooled accuracy weighs it 9:1
POOLED = {"mnist": 0.1, "svhn": 0.9}


def _write_run(root: Path, method: str, seed: int, rounds: int = 6, summary: dict | None = None):
    d = root / f"{method}_s{seed}"
    d.mkdir(parents=True)
    cfg = {
        "name": "digits",
        "seed": seed,
        "dataset": {"name": "digit5"},
        "partition": {"scheme": "domain"},
        "client": {"method": method, "params": {}},
        "server": {"strategy": "fedavg"},
        "evaluation": {"ema": 0.9, "report_metric": "last5"},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    dom = {k: v[seed] for k, v in ACC[method].items()}
    pooled = sum(POOLED[k] * v for k, v in dom.items())
    # as evaluate_model writes them: the domains, then "average", their unweighted mean
    per = {**dom, "average": sum(dom.values()) / len(dom)}
    recs = [
        {"round": r, "test_accuracy": pooled, "ema_accuracy": pooled, "domain_accuracy": per}
        for r in range(1, rounds + 1)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    s = {"method": method, "strategy": "fedavg", "rounds": rounds, "final_accuracy": pooled}
    s.update({"last5": pooled, "report_metric": "last5"})  # written before domain means
    s.update(summary or {})
    (d / "summary.json").write_text(json.dumps(s))
    return d


@pytest.fixture
def sweep(tmp_path):
    out = tmp_path / "sweep"
    for method in ACC:
        for seed in range(3):
            _write_run(out, method, seed)
    return out


def _mean(v):
    return sum(v) / len(v)


def test_inter_domain_runs_report_the_domain_mean(sweep):
    """An older summary (pooled report_metric, no domain keys) of an inter-domain run
    reports its domain mean, computed from metrics.jsonl; the pooled metric is unchanged
    and still there with --metric."""
    groups, metric = build_table([sweep])
    assert metric == "last5_domain_mean"
    fedavg = next(g for g in groups if g.row == "fedavg")
    assert fedavg.mean == pytest.approx(_mean([(0.90 + 0.30) / 2, (0.92 + 0.32) / 2, 0.64]))
    run = load_runs([sweep / "fedavg_s0"])[0]
    assert metric_value(run, "last5") == pytest.approx(0.1 * 0.90 + 0.9 * 0.30)
    assert metric_value(run, "final_domain_mean") == pytest.approx(0.60)
    assert metric_value(run, "ema@6_domain_mean") == pytest.approx(0.60)
    assert metric_value(run, "ema@7_domain_mean") is None  # never reached round 7
    groups, metric = build_table([sweep], "last5")
    assert metric == "last5" and not groups[0].domains


def test_summary_value_wins_and_missing_is_said(tmp_path, capsys):
    d = _write_run(tmp_path / "s", "fedavg", 0, summary={"last5_domain_mean": 0.5})
    assert metric_value(load_runs([d])[0], "last5_domain_mean") == 0.5
    (d / "metrics.jsonl").write_text("")  # no records, no per-domain accuracy anywhere
    (tmp_path / "s" / "fedavg_s0" / "summary.json").write_text(
        json.dumps({"method": "fedavg", "final_accuracy": 0.4, "report_metric": "last5"})
    )
    assert main(["report", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "| fedavg | missing |" in out
    assert "missing: runs without per-domain test accuracy" in out


def test_markdown_per_domain_columns_then_avg(sweep, capsys):
    assert main(["report", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "| method | mnist | svhn | Avg (last5_domain_mean) |" in out  # "average": no domain
    # fpl: mnist 93.00 ± 2.00, svhn 42.00 ± 2.00 (the best svhn), Avg (0.655+0.685+0.685)/3
    assert "| fpl | **93.00 ± 2.00** | **42.00 ± 2.00** | **67.50 ± 1.73 (n=3)** |" in out
    assert "| fedccl | 90.00 ± 1.00 | 36.00 ± 0.00 | 63.00 ± 0.50 (n=3) |" in out
    assert "metric: last5_domain_mean" in out and "the papers' Avg" in out


def test_paired_on_the_domain_mean_against_several_baselines(sweep, capsys):
    assert main(["report", str(sweep), "--vs", "fedavg", "--vs", "fedccl"]) == 0
    out = capsys.readouterr().out
    assert "Paired with fedavg" in out and "Paired with fedccl" in out
    # fpl - fedavg per seed on the domain mean: +0.055, +0.065, +0.045
    assert "| fpl | — | 0: +5.50, 1: +6.50, 2: +4.50 | +5.50 ± 1.00 |" in out
    # t(0.975, 2) = 4.302653: 5.50 ± 4.302653 · 1.00 / √3 = [3.02, 7.98]
    assert "[+3.02, +7.98]" in out
    # fpl - fedccl: 0.655 - 0.625, 0.685 - 0.63, 0.685 - 0.635
    assert "| fpl | — | 0: +3.00, 1: +5.50, 2: +5.00 |" in out
    assert "| last5_domain_mean |" not in out.split("Paired")[1]  # setting is not the metric


def test_one_vs_keeps_working(sweep, capsys):
    assert main(["report", str(sweep), "--vs", "fedavg"]) == 0
    out = capsys.readouterr().out
    assert out.count("Paired with") == 1


def test_csv_and_latex_per_domain(sweep, capsys):
    assert main(["report", str(sweep), "--format", "csv", "--vs", "fedavg", "--vs", "fpl"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6  # three rows per baseline
    fpl = next(r for r in rows if r["method"] == "fpl" and r["vs"] == "fedavg")
    assert (fpl["mnist"], fpl["svhn_std"], fpl["mean"]) == ("93.00", "2.00", "67.50")
    assert fpl["metric"] == "last5_domain_mean" and fpl["paired_mean"] == "+5.50"
    assert (
        next(r for r in rows if r["method"] == "fedavg" and r["vs"] == "fpl")["paired_mean"]
        == "-5.50"
    )
    assert main(["report", str(sweep), "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    assert r"Method & mnist & svhn & Avg (last5\_domain\_mean) \\" in tex
    assert r"fpl & $\mathbf{93.00 \pm 2.00}$" in tex


def test_plot_draws_per_domain_curves(sweep, tmp_path, capsys):
    assert main(["plot", str(sweep), "--out", str(tmp_path / "fig")]) == 0
    written = capsys.readouterr().out
    for name in ("fig.png", "fig_domains.png", "fig_domains.pdf"):
        assert (tmp_path / name).stat().st_size > 5000
        assert name in written
    from PIL import Image

    from fedrcl_flwr.report.figures import plot_domains
    from fedrcl_flwr.report.grouping import group_runs

    # a run without per-domain records draws no per-domain figure
    pooled = _write_run(tmp_path / "pooled", "fedavg", 0)
    lines = (pooled / "metrics.jsonl").read_text().splitlines()
    stripped = [{k: v for k, v in json.loads(x).items() if k != "domain_accuracy"} for x in lines]
    (pooled / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stripped))
    assert plot_domains(group_runs(load_runs([pooled])), [tmp_path / "none.png"]) == []
    assert not (tmp_path / "none.png").exists()
    w, h = Image.open(tmp_path / "fig_domains.png").size
    assert w > 1.5 * h  # two domain panels side by side


def test_one_seed_plot_is_not_titled_mean_over_seeds(tmp_path):
    from fedrcl_flwr.report.figures import curves_figure
    from fedrcl_flwr.report.grouping import group_runs

    _write_run(tmp_path / "one", "fedavg", 0)
    fig = curves_figure(group_runs(load_runs([tmp_path / "one"])))
    assert "one seed" in fig._suptitle.get_text()
    assert "over seeds" not in fig._suptitle.get_text()
    for seed in (1, 2):
        _write_run(tmp_path / "one", "fedavg", seed)
    fig = curves_figure(group_runs(load_runs([tmp_path / "one"])))
    assert "mean ± std over seeds" in fig._suptitle.get_text()


ROOT = Path(__file__).resolve().parents[2]
INTER_DOMAIN_YAMLS = sorted(
    p
    for p in [
        *(ROOT / "experiments" / "fedccl").glob("*.yaml"),
        *(ROOT / "experiments" / "rethinkfl").glob("*.yaml"),
    ]
    if (yaml.safe_load(p.read_text()).get("partition") or {}).get("scheme") == "domain"
)


def test_inter_domain_paper_yamls_report_and_compare_the_domain_mean():
    """FedCCL's inter-domain tables and FPL's report Avg (the unweighted mean over
    domains): each such YAML reports it and compares the paper's numbers with it."""
    from fedrcl_flwr.config import check_reference, load_config
    from fedrcl_flwr.config.catalog import is_domain_mean, reported_metric

    assert len(INTER_DOMAIN_YAMLS) >= 20
    for path in INTER_DOMAIN_YAMLS:
        cfg = load_config(path)
        metric = reported_metric(cfg.evaluation.report_metric, cfg.partition.scheme)
        assert is_domain_mean(metric), path
        for block in check_reference(cfg.reference, str(path)):
            assert block["metric"] == metric, path


@pytest.mark.integration
def test_tiny_inter_domain_run_reports_its_domain_mean_end_to_end(tiny, tmp_path, capsys):
    """A real run on two synthetic domains (in process, the server's own evaluation and
    recorder): summary.json reports the domain mean of its report_metric, equal to the
    mean of the last round's per-domain accuracies, and report lays it out per domain."""
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import dump_config
    from fedrcl_flwr.run.results import read_metrics

    cfg = tiny(
        dataset={
            "name": "synthetic",
            "synthetic": {"num_domains": 2, "num_train": 160, "num_test": 80},
        },
        partition={"scheme": "domain"},
        federation={"rounds": 2, "eval_every": 1, "num_clients": 2, "clients_per_round": 2},
        evaluation={"report_metric": "final"},
    )
    run_inprocess(cfg, tmp_path / "run")
    dump_config(cfg, tmp_path / "run" / "config.yaml")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    last = read_metrics(tmp_path / "run")[-1]["domain_accuracy"]
    domains = {k: v for k, v in last.items() if k != "average"}
    assert len(domains) == 2
    assert s["report_metric"] == "final_domain_mean"
    assert s["final_domain_mean"] == pytest.approx(sum(domains.values()) / 2)
    assert s["final_domain_mean"] == pytest.approx(last["average"])
    assert main(["report", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    names = " | ".join(domains)
    assert f"| method | {names} | Avg (final_domain_mean) |" in out


def test_paper_avg_stands_beside_our_domain_mean(tmp_path, capsys):
    """A reference block for the domain mean (FedCCL Table 1's Avg) is compared with our
    Avg, not with the pooled accuracy."""
    out = tmp_path / "s"
    for seed in range(3):
        d = _write_run(out, "fedavg", seed)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["reference"] = [
            {"source": "FedCCL Table 1", "metric": "last5_domain_mean", "values": {"fedavg": 50.08}}
        ]
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        "| Avg (last5_domain_mean) | Avg (last5_domain_mean) paper | Avg (last5_domain_mean) diff |"
        in text
    )
    # ours 62.00 ± 2.00 (domain means 0.60, 0.62, 0.64), paper 50.08: +11.92
    assert "| **62.00 ± 2.00 (n=3)** | 50.08 | +11.92 |" in text
    assert main(["report", str(out), "--metric", "last5"]) == 0
    assert "50.08" not in capsys.readouterr().out  # the paper's Avg is no pooled number


def test_last5_per_domain_of_the_summary_serves_without_records(tmp_path, capsys):
    d = _write_run(
        tmp_path / "s",
        "fedavg",
        0,
        summary={"last5_per_domain": {"mnist": 0.8, "svhn": 0.2, "average": 0.5}},
    )
    (d / "metrics.jsonl").write_text("")
    assert main(["report", str(tmp_path / "s")]) == 0
    assert "| fedavg | **80.00** | **20.00** | **50.00 (n=1)** |" in capsys.readouterr().out
