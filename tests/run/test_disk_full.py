"""A full disk during a run (ENOSPC injected where the run writes): one line naming the
file, exit 1; no ``.tmp`` file left; a torn metrics record cut back; ``run.log`` whole or
absent; the run resumes from its last checkpoint to the same weights as a run never
interrupted. In process: the run files layer, :func:`run_inprocess` and the CLI's
``main`` (no real full file system is needed)."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
import torch

from fedrcl_flwr import runner
from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.cli import main
from fedrcl_flwr.run.checkpoint import load_checkpoint
from fedrcl_flwr.run.results import RunRecorder, atomic_write_text, read_metrics
from fedrcl_flwr.run.run_files import RunFileError


def _enospc(path=None):
    return OSError(errno.ENOSPC, "No space left on device", path)


class _FullAfter:
    """A file object that takes ``room`` bytes, then raises ENOSPC."""

    def __init__(self, fh, room):
        self.fh, self.room = fh, room

    def write(self, data):
        if len(data) > self.room:
            self.fh.write(data[: self.room])
            self.fh.flush()
            raise _enospc()
        self.room -= len(data)
        return self.fh.write(data)

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def test_torn_record_is_cut_back(tmp_path, monkeypatch):
    rec = RunRecorder(tmp_path, method="fedavg", strategy="fedavg", rounds=3)
    rec.append({"round": 1, "test_accuracy": 0.5})
    before = (tmp_path / "metrics.jsonl").read_bytes()
    import builtins

    real_open = builtins.open

    def full_open(path, mode="r", *a, **k):
        fh = real_open(path, mode, *a, **k)
        return _FullAfter(fh, 7) if str(path).endswith("metrics.jsonl") and "a" in mode else fh

    monkeypatch.setattr(builtins, "open", full_open)
    with pytest.raises(RunFileError, match=r"cannot write .*metrics\.jsonl: No space left"):
        rec.append({"round": 2, "test_accuracy": 0.6})
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # not '{"round'
    assert [r["round"] for r in rec.records] == [1]


def test_atomic_files_are_whole_or_absent(tmp_path, monkeypatch):
    from pathlib import Path

    real = Path.write_text

    def full(self, text, *a, **k):
        real(self, text[:5], *a, **k)
        raise _enospc(str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(RunFileError, match="run.log"):
        atomic_write_text(tmp_path / "run.log", "the whole log\n" * 100)
    assert list(tmp_path.iterdir()) == []  # run.log absent, no run.log.tmp


def test_full_disk_at_a_checkpoint_then_resume_gives_the_same_weights(tiny, tmp_path, monkeypatch):
    cfg = tiny(
        dataset={
            "synthetic": {"num_train": 160, "num_test": 40, "num_classes": 4, "image_size": 8}
        },
        federation={"rounds": 2, "num_clients": 4},
        client={"batch_size": 40},
        output={"checkpoint_every": 1},
    )
    run_inprocess(cfg, tmp_path / "full")
    import builtins

    real_open, calls = builtins.open, []

    def full_open(path, mode="r", *a, **k):
        fh = real_open(path, mode, *a, **k)
        if str(path).endswith("checkpoint.pt.tmp") and "w" in mode:
            calls.append(1)
            if len(calls) == 2:  # round 2's checkpoint: 100 bytes written, then the disk is full
                return _FullAfter(fh, 100)
        return fh

    monkeypatch.setattr(builtins, "open", full_open)
    cut = tmp_path / "cut"
    with pytest.raises(RunFileError) as err:
        run_inprocess(cfg, cut)
    monkeypatch.undo()
    assert str(err.value).startswith(f"cannot write {cut / 'checkpoint.pt'}: No space left")
    assert not [p.name for p in cut.rglob("*.tmp*")]
    assert load_checkpoint(cut)["round"] == 1  # the last complete checkpoint
    for line in (cut / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # no torn record
    run_inprocess(cfg, cut, resume=True)
    a = load_checkpoint(tmp_path / "full")["strategy"]["weights"]
    b = load_checkpoint(cut)["strategy"]["weights"]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    ma, mb = torch.load(tmp_path / "full" / "model.pt"), torch.load(cut / "model.pt")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    strip = lambda rs: [{k: v for k, v in r.items() if "time" not in k} for r in rs]  # noqa: E731
    assert strip(read_metrics(cut)) == strip(read_metrics(tmp_path / "full"))


@pytest.mark.parametrize("where", ["run", "config"])
def test_cli_full_disk_is_one_line_exit_1(tiny, tmp_path, capsys, monkeypatch, where):
    import yaml

    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "dataset": {"synthetic": {"num_train": 64, "num_test": 16, "image_size": 8}},
                "partition": {"scheme": "iid"},
                "federation": {
                    "num_clients": 4,
                    "rounds": 1,
                    "participation": None,
                    "clients_per_round": 2,
                },
                "client": {"device": "cpu"},
            }
        )
    )
    out = tmp_path / "out"
    if where == "run":  # the ServerApp (or the fetched run.log) could not be written

        def sim(cfg, out_dir, **kw):
            atomic_write_text(out_dir / "run.log", "x")
            return {}

        from pathlib import Path

        real = Path.write_text

        def full(self, text, *a, **k):
            if self.name.startswith("run.log"):
                raise _enospc(str(self))
            return real(self, text, *a, **k)

        monkeypatch.setattr(Path, "write_text", full)
        monkeypatch.setattr(runner, "run_simulation_via_flower", sim)
        named = out / "run.log"
    else:  # the CLI's own config.yaml

        def dump(cfg, path):
            raise _enospc(str(path))

        monkeypatch.setattr("fedrcl_flwr.config.dump_config", dump)
        named = out / "config.yaml"
    rc = main(["run", str(exp), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert f"cannot write {named}" in err[0] and "internal error" not in err[0], err
    assert not [p for p in out.rglob("*.tmp")]
