"""``report`` on damaged or large results, and every printing command on a closed pipe,
through the CLI's ``main`` in process: a cut last line of ``metrics.jsonl`` is warned
about, garbage in the middle is exit 2 naming ``file:line``, the records are parsed only
when the metric needs them (bounded time), labels are escaped for Markdown, and a closed
pipe ends the command quietly with 141."""

from __future__ import annotations

import json

import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.report import grouping, metrics, reading


def _run(d, records, text_tail="", summary=True, label=None):
    d.mkdir(parents=True)
    cfg = {"seed": 0, "client": {"method": "fedavg"}, "server": {"strategy": "fedavg"}}
    if label is not None:
        cfg["label"] = label
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if summary:
        (d / "summary.json").write_text(json.dumps({"final_accuracy": records[-1][1]}))
    body = "".join(json.dumps({"round": r, "test_accuracy": a}) + "\n" for r, a in records)
    (d / "metrics.jsonl").write_text(body + text_tail)
    return d


def test_cut_last_line_is_warned_about(tmp_path, capsys):
    d = _run(tmp_path / "r", [(1, 0.5), (2, 0.75)], '{"round": 3, "test_acc')
    assert main(["report", str(d)]) == 0
    out, err = capsys.readouterr()
    assert "75.00" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{d / 'metrics.jsonl'}:3" in lines[0], err
    assert "cut short" in lines[0]


@pytest.mark.parametrize("summary", [True, False])
@pytest.mark.parametrize(
    "middle", ["garbage", '{"round": 2, "test_acc', '{"round": 2, "test_accuracy": 7}']
)
def test_garbage_in_the_middle_is_exit_2_naming_file_and_line(tmp_path, capsys, middle, summary):
    d = _run(
        tmp_path / "r",
        [(1, 0.5)],
        middle + "\n" + '{"round": 3, "test_accuracy": 0.6}\n',
        summary=summary,
    )
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{d / 'metrics.jsonl'}:2:" in err[0], err


def test_records_are_parsed_only_when_the_metric_needs_them(tmp_path, capsys):
    """The default metric comes from summary.json: the records are framed and checked
    line by line, never parsed in full (what keeps a 134 MB file in seconds). A metric
    only the records have parses them, with the same values."""
    recs = [(r, 0.1 + r / 100) for r in range(1, 41)]
    d = _run(tmp_path / "r", recs)
    runs = reading.load_runs([str(d)])
    assert isinstance(runs[0].records, reading.Records)
    groups, metric = grouping.build_table([str(d)])
    assert metric == "final" and groups[0].mean == pytest.approx(0.5)
    assert groups[0].runs[0].records._parsed is None  # the frame check was enough
    assert metrics._last_round(groups[0].runs[0]) == 40
    (d / "summary.json").write_text("{}")
    groups, _ = grouping.build_table([str(d)], "best")
    assert groups[0].mean == pytest.approx(0.5)
    assert [r["round"] for r in groups[0].runs[0].records] == list(range(1, 41))


def test_markdown_specials_in_labels_are_escaped(tmp_path, capsys):
    _run(tmp_path / "s" / "a", [(1, 0.5)], label="a|b *c* [x](y)")
    _run(tmp_path / "s" / "b", [(1, 0.25)], label="plain")
    assert main(["report", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| a")]
    assert rows == ["| a\\|b \\*c\\* \\[x\\](y) | **50.00 (n=1)** |"], out
    table = [line for line in out.splitlines() if line.startswith("|")]
    # every row has as many unescaped cell separators as the header
    assert len({line.replace("\\|", "").count("|") for line in table}) == 1, table


class _ClosedPipe:
    """stdout whose reader went away."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def _sweep_file(tmp_path):
    base = {
        "name": "s",
        "dataset": {"name": "synthetic", "synthetic": {"num_train": 64, "num_test": 16}},
        "federation": {
            "num_clients": 4,
            "rounds": 1,
            "participation": None,
            "clients_per_round": 2,
        },
        "client": {"device": "cpu"},
    }
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sw = tmp_path / "sweep.yaml"
    sw.write_text(yaml.safe_dump({"base": "base.yaml", "seeds": [0, 1]}))
    return sw


@pytest.mark.parametrize("command", ["report", "cache ls", "sweep --dry-run"])
def test_closed_pipe_ends_quietly_with_141(tmp_path, capsys, monkeypatch, command):
    argv = {
        "report": lambda: ["report", str(_run(tmp_path / "r", [(1, 0.5)]))],
        "cache ls": lambda: ["cache", "ls", "--cache-dir", str(tmp_path)],
        "sweep --dry-run": lambda: [
            "sweep",
            str(_sweep_file(tmp_path)),
            "--out",
            str(tmp_path / "o"),
            "--dry-run",
        ],
    }[command]()
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main(argv) == 141
    assert capsys.readouterr().err == ""
