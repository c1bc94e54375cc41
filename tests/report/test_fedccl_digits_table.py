"""``benchmarks/fedccl_digits_table.py``: the domain-mean table and its paired intervals,
on run directories written here (numbers by hand: a t-interval with t(0.975, 2))."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fedccl_digits_table as fdt  # noqa: E402

DOMAINS = ("a", "b")


def _run(root: Path, label: str, seed: int, per_round: list[tuple[float, float]]) -> None:
    d = root / f"{label}_seed={seed}_0000"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(
        yaml.safe_dump({"label": label, "seed": seed, "client": {"method": label}})
    )
    recs = []
    for r, (a, b) in enumerate(per_round, 1):
        recs.append({"round": r, "domain_accuracy": {"a": a, "b": b, "average": (a + b) / 2}})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    last = per_round[-5:]
    per = {k: sum(x[i] for x in last) / len(last) for i, k in enumerate(DOMAINS)}
    per["average"] = (per["a"] + per["b"]) / 2
    (d / "summary.json").write_text(json.dumps({"last5_per_domain": per}))


def test_table_and_paired_intervals_by_hand(tmp_path, capsys, monkeypatch):
    # domain means: fedavg 0.50 every seed; fedccl 0.51, 0.52, 0.53; fpl 0.50, 0.50, 0.56
    for s, (ccl, fpl) in enumerate([(0.51, 0.50), (0.52, 0.50), (0.53, 0.56)]):
        _run(tmp_path, "fedavg", s, [(0.0, 0.0)] + [(0.4, 0.6)] * 5)  # round 1 not in last5
        _run(tmp_path, "fedccl", s, [(ccl - 0.1, ccl + 0.1)] * 5)
        _run(tmp_path, "fpl", s, [(fpl, fpl)] * 5)
    (tmp_path / "fpl_seed=9_0000").mkdir()  # unfinished: config, no summary
    (tmp_path / "fpl_seed=9_0000" / "config.yaml").write_text("label: fpl\nseed: 9\n")

    rows, unfinished = fdt.load_runs(tmp_path)
    assert unfinished == 1 and set(rows) == {"fedavg", "fedccl", "fpl"}
    head, body = fdt.table(rows)
    assert head == ["row", "n", "a", "b", "Avg"]
    assert body[0] == ["fedavg", "3", "40.00 ± 0.00", "60.00 ± 0.00", "50.00 ± 0.00"]
    assert body[2][0] == "fedccl" and body[2][-1] == "52.00 ± 1.00"

    comp = {r[0]: r for r in fdt.paired(rows)}
    assert set(comp) == {"fpl − fedavg", "fedccl − fedavg", "fpl − fedccl"}
    # fedccl − fedavg: +1, +2, +3 -> mean 2, std 1, half-width 4.302653 / sqrt(3)
    assert comp["fedccl − fedavg"][1:] == [
        "3",
        "+2.00 ± 1.00",
        "[-0.48, +4.48]",
        "+1.00 +2.00 +3.00",
    ]
    # fpl − fedccl: -1, -2, +3 -> mean 0, std sqrt(7)
    m, sd, lo, hi = fdt.t_interval([-1.0, -2.0, 3.0])
    assert (m, sd) == (0.0, pytest.approx(7**0.5))
    assert hi == pytest.approx(4.302652729911275 * 7**0.5 / 3**0.5)
    assert lo == pytest.approx(-hi)

    monkeypatch.setattr(sys, "argv", ["fedccl_digits_table.py", str(tmp_path)])
    fdt.main()
    out = capsys.readouterr().out
    assert "| fedccl − fedavg | 3 |" in out and "1 run(s) unfinished" in out


def test_summary_that_disagrees_with_the_records_is_refused(tmp_path):
    _run(tmp_path, "fedavg", 0, [(0.4, 0.6)] * 5)
    d = next(tmp_path.iterdir())
    s = json.loads((d / "summary.json").read_text())
    s["last5_per_domain"]["a"] = 0.41
    (d / "summary.json").write_text(json.dumps(s))
    with pytest.raises(SystemExit, match="last five a average"):
        fdt.load_runs(tmp_path)
