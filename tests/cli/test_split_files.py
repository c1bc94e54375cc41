"""``fedrcl-flwr partition --save`` and ``partition.scheme: file``: the saved
split reads back identically, an authors'-format file drives a run, and a bad file is one
line with exit 2 before any Flower process starts."""

import json

import numpy as np
import yaml
from helpers import tiny_config

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.cli import main
from fedrcl_flwr.config import config_from_dict, dump_config
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.runtime import client_partitions, load_bundle


def _yaml(tmp_path, **sections):
    cfg = tiny_config(tmp_path, **sections)
    path = tmp_path / "exp.yaml"
    dump_config(cfg, path)
    return cfg, path


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")} for r in recs]


def test_save_round_trips_through_scheme_file(tmp_path, capsys):
    cfg, path = _yaml(
        tmp_path, partition={"scheme": "dirichlet", "alpha": 0.1, "balanced": True, "seed": 3}
    )
    out = tmp_path / "split.json"
    assert main(["partition", str(path), "--save", str(out), "--max-rows", "2"]) == 0
    assert f"split written to {out}" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    want = client_partitions(cfg)
    assert list(saved) == [str(c) for c in range(8)]
    assert [saved[str(c)] for c in range(8)] == [p.tolist() for p in want]
    back = tiny_config(tmp_path, partition={"scheme": "file", "path": str(out)})
    got = client_partitions(back)
    assert all(np.array_equal(a, b) for a, b in zip(got, want)) and len(got) == 8
    # the CLI table of the file split equals the one of the original split
    main(["partition", str(path)])
    table = capsys.readouterr().out
    assert (
        main(
            [
                "partition",
                str(path),
                "--set",
                "partition.scheme=file",
                "--set",
                f"partition.path={out}",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == table


def test_partition_seed_defaults_to_experiment_seed(tmp_path):
    from fedrcl_flwr.data.partition import partition

    def split(cfg, seed):
        return partition(load_bundle(cfg).train_labels, 8, "dirichlet", alpha=0.5, seed=seed)

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(a, b))

    plain = tiny_config(tmp_path, seed=4)
    assert same(client_partitions(plain), split(plain, 4))
    # (the synthetic data's labels follow ``seed``; the split follows partition.seed)
    fixed = tiny_config(tmp_path, seed=4, partition={"seed": 7})
    assert same(client_partitions(fixed), split(fixed, 7))
    assert not same(split(fixed, 7), split(fixed, 4))


def test_authors_format_file_drives_a_run(tmp_path):
    base = tiny_config(tmp_path, federation={"rounds": 1})
    run_inprocess(base, tmp_path / "a")
    parts = client_partitions(base)
    # the authors' released format: a Python dict literal with int keys
    lit = tmp_path / "dirichlet0.5_clients8.txt"
    lit.write_text(repr({c: p.tolist() for c, p in enumerate(parts)}))
    same = tiny_config(
        tmp_path, federation={"rounds": 1}, partition={"scheme": "file", "path": str(lit)}
    )
    run_inprocess(same, tmp_path / "b")
    assert _strip(read_metrics(tmp_path / "b")) == _strip(read_metrics(tmp_path / "a"))
    # a file giving every client class-0 samples only: the local CE falls and the global
    # model is pushed to class 0 (its test loss on the 4 balanced classes rises)
    labels = load_bundle(base).train_labels
    zeros = np.flatnonzero(labels == 0)
    one = tmp_path / "one_class.txt"
    one.write_text(repr({c: zeros[c::8].tolist() for c in range(8)}))
    skew = tiny_config(
        tmp_path,
        federation={"rounds": 1},
        client={"local_epochs": 3, "lr": 0.1},
        partition={"scheme": "file", "path": str(one)},
    )
    run_inprocess(skew, tmp_path / "c")
    rec, ref = read_metrics(tmp_path / "c")[-1], read_metrics(tmp_path / "a")[-1]
    assert rec["train_loss"] < ref["train_loss"] - 0.2
    assert rec["test_loss"] > ref["test_loss"] + 0.5


def test_bad_split_file_is_exit_2_before_flower(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({str(c): [c + 1] for c in range(8)} | {"7": [2]}))
    _, path = _yaml(tmp_path, partition={"scheme": "file", "path": str(bad)})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "index 2 is given more than once (clients [1, 7])" in err[0]
    assert str(path) in err[0] and "partition.path" in err[0], err
    assert "holds 2 clients (ids 0..1) but federation.num_clients is 8" in _run_err(
        tmp_path, capsys, {"0": [1], "1": [2]}
    )
    assert not (tmp_path / "run").exists()


def _run_err(tmp_path, capsys, data):
    bad = tmp_path / "bad2.json"
    bad.write_text(json.dumps(data))
    _, path = _yaml(tmp_path, partition={"scheme": "file", "path": str(bad)})
    assert main(["run", str(path)]) == 2
    return capsys.readouterr().err


def test_scheme_file_needs_path(tmp_path):
    import pytest

    from fedrcl_flwr.config import ConfigError

    data = yaml.safe_load(_yaml(tmp_path)[1].read_text())
    data["partition"]["scheme"] = "file"
    with pytest.raises(ConfigError, match="'partition.path' is required"):
        config_from_dict(data, "x.yaml")
