"""``fedrcl-flwr partition``: prints the per-client class table, writes the heatmap, and
turns bad input into exit code 2 with one line (no traceback)."""

import re
import subprocess
import sys
from pathlib import Path

from fedrcl_flwr.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _client_rows(out: str) -> list[list[int]]:
    rows = []
    for line in out.splitlines():
        if re.match(r"^\| \d+ \|", line):
            rows.append([int(v) for v in line.strip("| ").split(" | ")])
    return rows


def test_partition_quickstart_table_and_plot(tmp_path, capsys):
    png = tmp_path / "split.png"
    rc = main(["partition", QUICKSTART, "--plot", str(png), "--max-rows", "5"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "| client | size | classes | " + " | ".join(map(str, range(10))) + " |"
    rows = _client_rows(out)
    # quickstart: 20000 samples, 100 clients, balanced Dirichlet(0.3): exactly 200 each
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]
    for r in rows:
        size, n_classes, counts = r[1], r[2], r[3:]
        assert len(counts) == 10 and sum(counts) == size == 200
        assert n_classes == sum(c > 0 for c in counts)
    # α = 0.3: label skew, most clients miss some classes
    assert sum(r[2] < 10 for r in rows) >= 3
    assert "| ... 95 more clients |" in out
    summary = re.search(
        r"100 clients, 20000 samples; size min/mean/max 200/200.0/200; "
        r"classes per client mean (\d+\.\d+)",
        out,
    )
    assert summary, out
    assert 1.0 < float(summary.group(1)) < 9.0
    assert f"heatmap written to {png}" in out
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 2000
    # image is a real raster (width/height from the IHDR chunk)
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 200 and height >= 200


def test_partition_with_overrides_and_no_plot(tmp_path, capsys):
    # 600 samples, 60 per class; 10 clients x 1 shard of 60 label-sorted samples: each
    # client holds exactly one class, all of it
    rc = main(
        [
            "partition",
            QUICKSTART,
            "--set",
            "dataset.synthetic.num_train=600",
            "--set",
            "federation.num_clients=10",
            "--set",
            "partition.scheme=shards",
            "--set",
            "partition.shards_per_client=1",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = _client_rows(out)
    assert len(rows) == 10  # no --max-rows: every client
    held = []
    for r in rows:
        assert r[1] == 60 and r[2] == 1
        held.append(r[3:].index(60))
    assert sorted(held) == list(range(10))
    assert "size min/mean/max 60/60.0/60; classes per client mean 1.00" in out
    assert "heatmap" not in out
    assert not list(tmp_path.iterdir())


def test_bad_override_is_one_line_exit_2(capsys):
    rc = main(["partition", QUICKSTART, "--set", "partition.alpha=-1"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "'partition.alpha'" in lines[0] and "must be > 0" in lines[0]
    assert lines[0].startswith("fedrcl-flwr: error:")


def test_impossible_partition_is_one_line_exit_2(capsys):
    # 100 clients x 10 shards = 1000 shards, but only 500 training samples
    rc = main(
        [
            "partition",
            QUICKSTART,
            "--set",
            "dataset.synthetic.num_train=500",
            "--set",
            "partition.scheme=shards",
            "--set",
            "partition.shards_per_client=10",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "1000 shards but only 500 samples" in lines[0]
    assert "quickstart.yaml" in lines[0]


def test_missing_experiment_file_exit_2(tmp_path, capsys):
    rc = main(["partition", str(tmp_path / "nope.yaml")])
    _, err = capsys.readouterr()
    assert rc == 2 and "experiment file not found" in err and len(err.strip().splitlines()) == 1


def test_bad_override_as_a_process_has_no_traceback():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedrcl_flwr.cli",
            "partition",
            QUICKSTART,
            "--set",
            "partition.alpha=-1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'partition.alpha'" in lines[0], r.stderr
    assert r.stdout == ""


def test_flower_partitioner_heatmap_title_names_alpha(tmp_path):
    from helpers import tiny_config

    from fedrcl_flwr.data.report import partition_title

    spec = {"name": "DirichletPartitioner", "alpha": 0.3, "partition_by": "label"}
    cfg = tiny_config(tmp_path, partition={"scheme": "flwr_datasets", "partitioner": spec})
    assert partition_title(cfg).endswith("clients, Flower Datasets DirichletPartitioner α=0.3")
    spec = {"name": "IidPartitioner"}
    cfg = tiny_config(tmp_path, partition={"scheme": "flwr_datasets", "partitioner": spec})
    assert partition_title(cfg).endswith("IidPartitioner")
