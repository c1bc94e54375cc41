"""``report`` on a ``metrics.jsonl`` or ``summary.json`` damaged with numbers no run
writes (a round of 10**400, an accuracy of 10**400, an integer of 5,000 digits): exit 2,
one line naming ``file:line`` (or the file) and the key, never an internal error."""

from __future__ import annotations

import json

import pytest
import yaml

from fedrcl_flwr.cli import main

BIG = "1" + "0" * 400
HUGE = "1" + "0" * 5000  # beyond Python's 4,300 digits of int <-> str


def _run(d, metrics: str, summary: str):
    d.mkdir(parents=True)
    cfg = {"seed": 0, "client": {"method": "fedavg"}, "server": {"strategy": "fedavg"}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "summary.json").write_text(summary)
    (d / "metrics.jsonl").write_text(metrics)
    return d


GOOD = '{"round": 1, "test_accuracy": 0.5, "ema_accuracy": 0.5}\n'


@pytest.mark.parametrize("metric", ["final", "last5", "ema@2"])
@pytest.mark.parametrize(
    "line, key",
    [
        (f'{{"round": {BIG}, "test_accuracy": 0.6, "ema_accuracy": 0.6}}', "'round'"),
        (f'{{"round": {HUGE}, "test_accuracy": 0.6}}', "not valid JSON"),
        (f'{{"round": 2, "test_accuracy": 0.6, "ema_accuracy": {BIG}}}', "'ema_accuracy'"),
        (f'{{"round": 2, "test_accuracy": {BIG}}}', "'test_accuracy'"),
    ],
)
def test_a_damaged_line_is_named(tmp_path, capsys, metric, line, key):
    d = _run(tmp_path / "r", GOOD + line + "\n", json.dumps({"final_accuracy": 0.6}))
    assert main(["report", str(d), "--metric", metric]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{d / 'metrics.jsonl'}:2:" in err and key in err, err
    assert "internal error" not in err and len(err) < 600


@pytest.mark.parametrize(
    "summary, key",
    [
        (f'{{"final_accuracy": 0.6, "rounds": {BIG}}}', "'rounds'"),
        (f'{{"final_accuracy": 0.6, "accuracy_at": {{"2": {BIG}}}}}', "'accuracy_at'"),
        (f'{{"final_accuracy": {BIG}}}', "'final_accuracy'"),
        (f'{{"final_accuracy": 0.6, "rounds": {HUGE}}}', "not valid JSON"),
    ],
)
def test_a_damaged_summary_is_named(tmp_path, capsys, summary, key):
    d = _run(tmp_path / "r", GOOD, summary)
    assert main(["report", str(d), "--metric", "ema@2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{d / 'summary.json'}:" in err and key in err, err
    assert len(err) < 600


def test_progress_and_resume_reading_stop_at_a_damaged_line(tmp_path):
    """The lenient reader (progress lines, resume bookkeeping) keeps the records before."""
    from fedrcl_flwr.run.results import read_metrics

    for bad in (f'{{"round": {HUGE}}}', f'{{"round": {BIG}}}'):
        d = tmp_path / str(len(bad))
        d.mkdir()
        (d / "metrics.jsonl").write_text(GOOD + bad + "\n" + GOOD)
        assert [r["round"] for r in read_metrics(d)] == [1]
