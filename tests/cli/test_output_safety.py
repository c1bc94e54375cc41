"""Through the command line (``main`` in process; the sweep's process handling in
a real subprocess, marked ``flwr``): the tool deletes only what it created and can
recognise, writes only inside the directory it was given, never executes data, never mixes
two experiments in one directory, and answers bad input with one line and exit 2 before
touching anything.

No test here starts a Flower process except the one marked ``flwr``: where a command
would go on to run the simulation, ``run_simulation_via_flower`` is replaced by a stub that
records the call (``flower`` fixture), so "refused" and "accepted" are both observable in
seconds."""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY, alive

from fedrcl_flwr.cli import main
from fedrcl_flwr.launch.processes import OutputLock, procs_with
from fedrcl_flwr.launch.sweep_spec import plan_sweep
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.run_files import LOCK_FILE

ROOT = Path(__file__).resolve().parents[2]

BASE = TINY  # a seconds-sized experiment on the embedded synthetic data


def has_marker(directory, kind):  # the tool's run-directory marker (fedrcl_flwr.run.results)
    from fedrcl_flwr.run.results import has_marker as has

    return has(directory, kind)


def write_marker(directory, kind):
    from fedrcl_flwr.run.results import write_marker as write

    write(directory, kind)


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _exp(tmp_path, fname="exp.yaml", **sections) -> Path:
    data = json.loads(json.dumps(BASE))
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    return _write(tmp_path / fname, data)


def _sweep(tmp_path, **spec) -> Path:
    _exp(tmp_path, "base.yaml")
    spec.setdefault("base", "base.yaml")
    return _write(tmp_path / "sweep.yaml", spec)


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(capsys, *argv) -> str:
    """Run the CLI; it must answer exit 2 with one line (no traceback); returns it."""
    rc, out, err = _cli(capsys, *argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, out, err)
    assert lines[0].startswith("fedrcl-flwr: error:") and "Traceback" not in err
    return lines[0]


def _tree(path: Path) -> dict:
    """Every file and directory under ``path`` with its bytes (nothing-touched checks)."""
    out = {}
    for p in sorted(Path(path).rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = "<link>" if p.is_symlink() else ("<dir>" if p.is_dir() else p.read_bytes())
    return out


@pytest.fixture
def flower(monkeypatch):
    """Replace the Flower run by a stub: ``calls`` lists (out_dir, resume) of every run
    the CLI would have started; the stub writes a summary as the ServerApp would."""
    import fedrcl_flwr.runner as runner

    calls = []

    def fake(cfg, out_dir, *, resume=False, **kw):
        calls.append((Path(out_dir), resume))
        (Path(out_dir) / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
        return {"final_accuracy": 0.5, "ema_accuracy": 0.5}

    monkeypatch.setattr(runner, "run_simulation_via_flower", fake)
    return calls


# ------------------------------------------------------------------------- Bad 1: names


@pytest.mark.parametrize(
    "where,value,needle",
    [
        ("name", "ABS", "'name'"),  # an absolute path: was deleted and run into
        ("name", "..", "'name'"),
        ("name", "a/b", "'name'"),
        ("name", "x" * 300, "'name'"),
        ("label", "..", "variants[0].label"),  # was: rmtree of --out's parent
        ("label", ".", "variants[0].label"),
        ("label", "a/../b", "variants[0].label"),
        ("label", "a\\b", "variants[0].label"),
        ("label", "bell\x07", "variants[0].label"),
        ("label", "", "variants[0].label"),
        ("label", "y" * 300, "variants[0].label"),  # over-long: was an internal error
        ("label", "_logs", "variants[0].label"),  # the sweep's own directory
        ("label", ["a"], "variants[0].label"),
    ],
)
def test_sweep_names_and_labels_are_single_safe_path_components(
    tmp_path, capsys, monkeypatch, where, value, needle
):
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / "keep" / "data.txt").write_text("precious")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    if value == "ABS":
        value = str(victim)
    spec = {
        "variants": [
            {"label": "ok", "client.method": "fedavg"},
            {"label": "ok2", "client.method": "fedprox"},
        ]
    }
    if where == "name":
        spec["name"] = value
    else:
        spec["variants"][0]["label"] = value
    sw = _sweep(work, **spec)
    before = _tree(tmp_path)
    argv = ["sweep", sw] if where == "name" else ["sweep", sw, "--out", work / "s" / "out"]
    line = _refused(capsys, *argv)
    assert needle in line and str(sw) in line
    assert _tree(tmp_path) == before  # nothing created, nothing removed


def test_run_overwrite_removes_only_a_run_directory_the_tool_created(tmp_path, capsys, flower):
    """A directory that holds run-like files but no marker is never cleared; in one the
    tool created, --overwrite removes the run's files and marked sub-directories only."""
    exp = _exp(tmp_path)
    user = tmp_path / "mine"
    (user / "client_state").mkdir(parents=True)
    (user / "client_state" / "thesis.tex").write_text("chapter 1")
    for f in ("metrics.jsonl", "summary.json", "notes.txt"):
        (user / f).write_text(f"mine: {f}")
    before = _tree(user)
    line = _refused(capsys, "run", exp, "--out", user, "--overwrite")
    assert "not created by fedrcl-flwr" in line and str(user) in line
    assert _tree(user) == before and not flower
    # a directory holding only a user's config.yaml is not written into either
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text("my own config\n")
    line = _refused(capsys, "run", exp, "--out", other)
    assert "config.yaml" in line and (other / "config.yaml").read_text() == "my own config\n"
    # the tool's own run directory: cleared of the run's files, the rest kept
    rc, _, err = _cli(capsys, "run", exp, "--out", tmp_path / "run")
    assert rc == 0, err
    run = tmp_path / "run"
    assert has_marker(run, "run") and flower[-1] == (run, False)
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    (run / "client_state").mkdir()
    write_marker(run / "client_state", "client_state")
    (run / "client_state" / "moon_prev_0.pt").write_bytes(b"x")
    (run / "notes.txt").write_text("kept")
    (run / "foreign_dir").mkdir()
    rc, _, err = _cli(capsys, "run", exp, "--out", run, "--overwrite")
    assert rc == 0, err
    assert not (run / "metrics.jsonl").exists() and not (run / "client_state").exists()
    assert (run / "notes.txt").read_text() == "kept" and (run / "foreign_dir").is_dir()
    # a client_state directory without its marker is not ours: refused, left in place
    (run / "client_state").mkdir()
    (run / "client_state" / "x.pt").write_bytes(b"y")
    line = _refused(capsys, "run", exp, "--out", run, "--overwrite")
    assert "client_state" in line and (run / "client_state" / "x.pt").exists()


def test_a_run_never_writes_through_a_link_in_its_directory(resumable, tmp_path, capsys, flower):
    """A link planted in a run directory (the tool's own) would make the run write outside
    it: refused for a new run and a resume alike; --overwrite removes the link itself."""
    exp, run = resumable
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    write_marker(run, "run")
    (run / "run.log").symlink_to(victim)
    line = _refused(capsys, "run", "--resume", run)
    assert "run.log is a link" in line
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    write_marker(fresh, "run")
    (fresh / "flower.log").symlink_to(victim)
    line = _refused(capsys, "run", exp, "--out", fresh)
    assert "flower.log is a link" in line and not flower
    rc, _, err = _cli(capsys, "run", exp, "--out", fresh, "--overwrite")
    assert rc == 0, err
    assert not (fresh / "flower.log").is_symlink() and victim.read_text() == "precious"


def test_sweep_never_removes_a_run_directory_it_cannot_recognise(tmp_path, capsys, flower):
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedprox"]})
    out = tmp_path / "out"
    stranger = plan_sweep(sw, out)[0][0].out_dir  # where the first run goes
    stranger.mkdir(parents=True)
    (stranger / "run.log").write_text("someone else's log")
    (stranger / "results.csv").write_text("1,2,3")
    before = _tree(tmp_path)
    line = _refused(capsys, "sweep", sw, "--out", out)
    assert stranger.name in line and "not created by fedrcl-flwr" in line
    assert _tree(tmp_path) == before and not flower
    # a link in place of a run directory is refused as well (its target is elsewhere)
    stranger.rename(tmp_path / "elsewhere")
    stranger.symlink_to(tmp_path / "elsewhere")
    line = _refused(capsys, "sweep", sw, "--out", out)
    assert "link" in line and (tmp_path / "elsewhere" / "results.csv").exists()


# ------------------------------------------------------------------- Bad 2: cache clear


def _cache_entry(tmp_path) -> Path:
    from fedrcl_flwr.config import load_config
    from fedrcl_flwr.data.cache import store

    cfg = load_config(_exp(tmp_path, "c.yaml", dataset={"cache_dir": str(tmp_path / "cache")}))
    return store.load(cfg.dataset, cfg.seed)[1]


def test_cache_clear_removes_only_entries_proven_ours(tmp_path, capsys):
    entry = _cache_entry(tmp_path)
    root = entry.parent
    (root / "photos").mkdir()
    (root / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    hexdir = root / ("ab" * 16)  # named like a key, but holds someone else's file
    hexdir.mkdir()
    (hexdir / "notes.txt").write_text("not a cache entry")
    target = tmp_path / "target"
    target.mkdir()
    (target / "meta.json").write_text("{}")
    (root / ("cd" * 16)).symlink_to(target)  # a link named like a key
    (root / ".git").mkdir()
    foreign = {p.name for p in root.iterdir()} - {entry.name}
    snap = {n: _tree(root / n) for n in foreign}
    rc, out, err = _cli(capsys, "cache", "ls", "--cache-dir", root)
    assert rc == 0, err
    assert "1 entry" in out and out.count("foreign") == len(foreign)
    # the empty string (and anything but hex digits) is no key prefix, let alone "all"
    for bad in ("", "xyz", "../" + entry.name):
        line = _refused(capsys, "cache", "clear", bad, "--cache-dir", root)
        assert "key prefix" in line
    assert entry.is_dir()
    line = _refused(capsys, "cache", "clear", "--cache-dir", "")
    assert "--cache-dir" in line
    rc, out, err = _cli(capsys, "cache", "clear", "--cache-dir", root)
    assert rc == 0, err
    assert "removed 1 entry" in out and "not dataset cache entries" in out
    assert not entry.exists()
    assert {p.name for p in root.iterdir()} == foreign
    assert {n: _tree(root / n) for n in foreign} == snap
    assert (target / "meta.json").read_text() == "{}"


# ----------------------------------------------------------------- Bad 3: checkpoints


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.environ["EVIL_MARK"],))


def test_a_crafted_checkpoint_in_a_sweep_dir_runs_no_code(tmp_path, capsys, monkeypatch):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("EVIL_MARK", str(mark))
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedprox"]})
    run = plan_sweep(sw, tmp_path / "out")[0][0].out_dir
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    torch.save({"round": _Evil(), "strategy": {}}, run / "checkpoint.pt")
    rc, out, err = _cli(capsys, "sweep", sw, "--out", tmp_path / "out", "--dry-run")
    assert rc == 0, err
    assert f"{run.name}  [resume after round 0]" in out
    assert not mark.exists()


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):  # a bare call: eval(...), open(...)
                yield node, None, f.id
            elif isinstance(f, ast.Attribute):  # owner.name(...); owner "" if not a name
                yield node, f.value.id if isinstance(f.value, ast.Name) else "", f.attr


def test_no_code_path_unpickles_or_bypasses_the_safe_loaders():
    """Scan the project's source: no call passes ``weights_only=False`` (tests included);
    outside ``fedrcl_flwr/serialization.py`` nothing calls ``torch.load`` (every load goes
    through ``serialization.safe_load``); no ``pickle`` loads, ``allow_pickle=True``,
    ``yaml.load``/``unsafe_load``/``safe_load`` outside ``config/loading.py``'s hardened reader,
    ``eval``/``exec``/``ast.literal_eval`` of data."""
    bad = []
    files = [
        p
        for d in ("fedrcl_flwr", "clients", "strategies", "benchmarks", "tests")
        for p in sorted((ROOT / d).rglob("*.py"))
    ]
    assert len(files) > 50
    for path in files:
        rel = str(path.relative_to(ROOT))
        is_test = rel.startswith("tests/")
        for node, owner, name in _calls(ast.parse(path.read_text(), rel)):
            where = f"{rel}:{node.lineno}"
            for kw in node.keywords:
                if (
                    kw.arg == "weights_only"
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is not True
                ):
                    bad.append(f"{where}: weights_only={kw.value.value!r}")
                if (
                    kw.arg == "allow_pickle"
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is True
                    and not is_test
                ):
                    bad.append(f"{where}: allow_pickle=True")
            if is_test:
                continue
            if owner == "torch" and name == "load" and rel != "fedrcl_flwr/serialization.py":
                bad.append(f"{where}: torch.load outside serialization.safe_load")
            if owner in ("pickle", "cPickle", "dill", "joblib") and name in ("load", "loads"):
                bad.append(f"{where}: {owner}.{name}")
            if (
                owner == "yaml"
                and name
                in ("load", "unsafe_load", "full_load", "safe_load", "load_all", "safe_load_all")
                and rel != "fedrcl_flwr/config/loading.py"
            ):
                bad.append(f"{where}: yaml.{name} outside the hardened reader")
            if (owner, name) in ((None, "eval"), (None, "exec"), ("ast", "literal_eval")):
                bad.append(f"{where}: {name} of data")
    assert not bad, "\n".join(bad)


# -------------------------------------------------------- Bad 4: one sweep per --out


def test_a_sweep_is_never_run_into_a_held_directory(tmp_path, capsys, flower):
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedprox"]})
    out = tmp_path / "out"
    out.mkdir()
    lock = OutputLock(out, "sweep")  # as a running sweep holds it
    lock.acquire()
    try:
        line = _refused(capsys, "sweep", sw, "--out", out)
        assert f"PID {os.getpid()}" in line and "in use" in line
        assert sorted(os.listdir(out)) == [LOCK_FILE] and not flower
    finally:
        lock.release()
    # a run directory held by a live run (here: this process) is never launched into,
    # nor removed: the whole sweep is refused up front, naming the holder
    run = plan_sweep(sw, out)[0][1].out_dir
    run.mkdir()
    write_marker(run, "run")
    (run / "config.yaml").write_text("half-written\n")
    held = OutputLock(run)
    held.acquire()
    try:
        before = _tree(out)
        line = _refused(capsys, "sweep", sw, "--out", out)
        assert run.name in line and f"PID {os.getpid()}" in line
        assert _tree(out) == before and not flower
    finally:
        held.release()


# ------------------------------------------------------------------- Bad 6: resume


@pytest.fixture
def resumable(tmp_path):
    """A run stopped after round 1 of 2 (checkpointed), as `run` leaves it."""
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import dump_config, load_config

    exp = _exp(tmp_path, output={"dir": str(tmp_path / "run"), "checkpoint_every": 1})
    cfg = load_config(exp)
    run = tmp_path / "run"
    run_inprocess(cfg, run, stop_after=1)
    dump_config(cfg, run / "config.yaml")
    return exp, run


def test_resume_refuses_changes_to_the_experiment(resumable, tmp_path, capsys, flower):
    exp, run = resumable
    before = _tree(run)
    line = _refused(
        capsys,
        "run",
        "--resume",
        run,
        "--set",
        "client.method=fedprox",
        "--set",
        "partition.alpha=0.05",
    )
    assert "client.method" in line and "partition.alpha" in line and str(run) in line
    for change, key in [
        ("client.params={mu: 0.1}", "client.params"),
        ("seed=1", "seed"),
        ("client.lr=0.5", "client.lr"),
        ("model.params={width: 8}", "model.params"),
        ("evaluation.ema=0.5", "evaluation.ema"),
    ]:
        assert key in _refused(capsys, "run", "--resume", run, "--set", change)
    # another experiment's YAML with --resume: refused, naming what differs
    other = _exp(tmp_path, "other.yaml", name="another", seed=7)
    line = _refused(capsys, "run", other, "--resume", run)
    assert "name" in line and "seed" in line and "other.yaml" in line
    # fewer rounds than already done
    line = _refused(capsys, "run", "--resume", run, "--set", "federation.rounds=0")
    assert "federation.rounds" in line
    assert _tree(run) == before and not flower  # config.yaml, summary, metrics untouched
    # the documented allow-list: more rounds, evaluation/output cadence, resources
    rc, _, err = _cli(
        capsys,
        "run",
        "--resume",
        run,
        "--set",
        "federation.rounds=5",
        "--set",
        "federation.eval_every=2",
        "--set",
        "output.checkpoint_every=2",
        "--set",
        "simulation.num_cpus=1",
    )
    assert rc == 0, err
    assert flower == [(run, True)]
    # the same experiment file it was started from resumes too
    rc, _, err = _cli(capsys, "run", exp, "--resume", run)
    assert rc == 0, err


def test_fewer_rounds_than_done_is_refused(resumable, capsys, flower):
    exp, run = resumable
    from fedrcl_flwr.run.checkpoint import load_checkpoint, save_checkpoint

    ck = load_checkpoint(run)
    ck["round"] = 2  # as if both rounds were done; the run goes to 2
    save_checkpoint(run, ck)
    line = _refused(capsys, "run", "--resume", run, "--set", "federation.rounds=1")
    assert "federation.rounds=1" in line and "2 rounds already done" in line
    assert not flower


# --------------------------------------------------------- Bad 7 / Weak: cache contents


def _exp_cached(tmp_path):
    return _exp(tmp_path, "c.yaml", dataset={"cache_dir": str(tmp_path / "cache")})


def test_cache_arrays_edited_in_place_are_caught_and_rebuilt(tmp_path, capsys, flower):
    exp = _exp_cached(tmp_path)
    rc, _, err = _cli(capsys, "partition", exp, "--max-rows", "0")  # builds the entry
    assert rc == 0, err
    entry = next((tmp_path / "cache").iterdir())
    x = entry / "train_x.npy"
    good = x.read_bytes()
    raw = bytearray(good)
    raw[-100:] = bytes(255 - b for b in raw[-100:])  # same size: metadata still matches
    x.write_bytes(bytes(raw))
    rc, out, err = _cli(capsys, "cache", "ls", "--cache-dir", tmp_path / "cache")
    assert rc == 0 and "corrupt" in out and "content hash" in out, out
    rc, out, err = _cli(capsys, "run", exp, "--out", tmp_path / "o")
    assert rc == 0, err
    assert "rebuilding an unusable entry" in out and "content hash" in out
    assert x.read_bytes() == good and len(flower) == 1
    rc, out, _ = _cli(capsys, "cache", "ls", "--cache-dir", tmp_path / "cache")
    assert " ok" in out and "corrupt" not in out


def test_cache_meta_with_valid_hash_but_missing_fields(tmp_path, capsys, flower):
    import hashlib

    exp = _exp_cached(tmp_path)
    assert _cli(capsys, "partition", exp, "--max-rows", "0")[0] == 0
    entry = next((tmp_path / "cache").iterdir())
    meta = json.loads((entry / "meta.json").read_text())
    del meta["num_classes"]
    raw = json.dumps(meta).encode()
    (entry / "meta.json").write_bytes(raw)
    (entry / "meta.sha256").write_text(hashlib.sha256(raw).hexdigest() + "\n")
    rc, out, err = _cli(capsys, "cache", "ls", "--cache-dir", tmp_path / "cache")
    assert rc == 0 and "lacks 'num_classes'" in out, out + err
    rc, out, err = _cli(capsys, "run", exp, "--out", tmp_path / "o")
    assert rc == 0 and "rebuilding" in out, err
    assert "num_classes" in json.loads((entry / "meta.json").read_text())


# -------------------------------------------------------------- Bad 8 / Weak: split files


def _split_exp(tmp_path, text: str | bytes) -> Path:
    f = tmp_path / "split.txt"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return _exp(tmp_path, partition={"scheme": "file", "path": str(f)})


@pytest.mark.parametrize(
    "text,needle",
    [
        # a client id twice: JSON (was: the first list silently dropped) and the authors' format
        ('{"0": [0, 1], "1": [2], "2": [3], "3": [4], "1": [5]}', "client '1' appears twice"),
        ("{0: [0, 1], 1: [2], 2: [3], 3: [4], 1: [5]}", "client 1 appears twice"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (b"\x00\x01\x02binary\xff\xfe", "not UTF-8"),
        ('{"0": [1]}\x00', "binary"),
        ("{0: [1], 1: [__import__('os').getpid()]}", "neither JSON nor"),
    ],
)
def test_bad_split_files_are_one_line(tmp_path, capsys, text, needle):
    exp = _split_exp(tmp_path, text)
    for cmd in (["partition", exp], ["run", exp, "--out", tmp_path / "o"]):
        line = _refused(capsys, *cmd)
        assert needle in line and "partition.path" in line
    assert not (tmp_path / "o").exists()


def test_a_huge_split_file_is_refused_before_it_is_read(tmp_path, capsys):
    big = '{"0": [' + ", ".join(["1"] * 10_000_000) + "]}"  # 30 MB
    exp = _split_exp(tmp_path, big)
    t0 = time.time()
    line = _refused(capsys, "partition", exp)
    assert "too large for a split of 400 training samples" in line
    assert time.time() - t0 < 10


def test_the_authors_split_format_still_reads(tmp_path, capsys):
    text = repr(
        {0: list(range(0, 100)), 1: list(range(100, 200)), 2: [200, 201], 3: tuple(range(202, 400))}
    )
    rc, out, err = _cli(capsys, "partition", _split_exp(tmp_path, text))
    assert rc == 0, err
    assert "| 2 | 2 |" in out and "4 clients, 400 samples" in out


# --------------------------------------------------------- Bad 9 / Weak: report readers


def _run_dir(tmp_path, name="r", summary=None, metrics=None, config=None) -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    s = {"method": "fedavg", "strategy": "fedavg", "final_accuracy": 0.5, "rounds": 2}
    m = [
        {"round": 1, "test_accuracy": 0.4, "ema_accuracy": 0.04},
        {"round": 2, "test_accuracy": 0.5, "ema_accuracy": 0.09},
    ]
    for fname, default, given in (
        ("summary.json", json.dumps(s), summary),
        ("metrics.jsonl", "".join(json.dumps(r) + "\n" for r in m), metrics),
        ("config.yaml", yaml.safe_dump(BASE), config),
    ):
        value = default if given is None else given
        if value == "DIR":
            (d / fname).mkdir()
        elif isinstance(value, bytes):
            (d / fname).write_bytes(value)
        else:
            (d / fname).write_text(value)
    return d


def _bomb() -> str:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 7):  # 10**6 nodes once expanded
        rows.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return yaml.safe_dump(BASE) + "\n".join(rows) + "\n"


@pytest.mark.parametrize(
    "files,needle",
    [
        ({"config": _bomb()}, "anchors/aliases"),  # Bad 9
        ({"config": yaml.safe_dump(BASE) + "x: &r {y: *r}\n"}, "recursive alias"),
        ({"config": b"name: caf\xe9\n"}, "not UTF-8"),
        ({"metrics": b'{"round": 1, "test_accuracy": 0.5}\n\xff\xfe\n'}, "not UTF-8"),
        ({"summary": "DIR"}, "summary.json: not a regular file"),
        ({"config": "DIR"}, "config.yaml: not a regular file"),
        ({"summary": '{"final_accuracy": NaN}'}, "final_accuracy"),
        ({"summary": '{"final_accuracy": Infinity}'}, "final_accuracy"),
        ({"summary": '{"final_accuracy": 1.5}'}, "[0, 1]"),
        ({"summary": '{"best_accuracy": -0.1}'}, "best_accuracy"),
        ({"summary": '{"rounds": 2.5}'}, "rounds"),
        ({"summary": '{"accuracy_at": {"2": NaN}}'}, "accuracy_at"),
        ({"metrics": '{"round": 1.5, "test_accuracy": 0.5}\n'}, "'round'"),
        ({"metrics": '{"round": -1, "test_accuracy": 0.5}\n'}, "'round'"),
        ({"metrics": '{"round": 1, "test_accuracy": NaN}\n'}, "test_accuracy"),
        ({"metrics": '{"round": 1, "ema_accuracy": 7}\n'}, "ema_accuracy"),
        ({"config": yaml.safe_dump({**BASE, "client": 5})}, "'client' must be a mapping"),
        ({"config": yaml.safe_dump({**BASE, "server": {"strategy": [1]}})}, "server.strategy"),
    ],
)
def test_report_and_plot_refuse_bad_run_files_in_one_line(tmp_path, capsys, files, needle):
    d = _run_dir(tmp_path, **files)
    t0 = time.time()
    for cmd in (["report", d], ["plot", d, "--out", tmp_path / "curves"]):
        line = _refused(capsys, *cmd)
        assert needle in line, line
    assert time.time() - t0 < 30
    assert not list(tmp_path.glob("curves*"))


# ------------------------------------------------------------- Bad 10: ray_address


class _NotRay:
    """A loopback TCP server that is not Ray: it accepts, then says nothing (``silent``)
    or answers like a web server and hangs up (``http``)."""

    def __init__(self, mode: str):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.mode, self.conns = mode, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.mode == "http":
                try:
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    c.close()
                except OSError:
                    pass

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("mode", ["silent", "http"])
def test_ray_address_of_something_else_is_refused_at_once(tmp_path, capsys, flower, mode):
    server = _NotRay(mode)
    try:
        t0 = time.time()
        line = _refused(
            capsys,
            "run",
            _exp(tmp_path),
            "--out",
            tmp_path / "o",
            "--set",
            f"simulation.ray_address=127.0.0.1:{server.port}",
        )
        took = time.time() - t0
    finally:
        server.close()
    assert "simulation.ray_address" in line and "not a Ray head node" in line
    assert took < 30 and not flower and not (tmp_path / "o").exists()


# ------------------------------------------------------- Bad 11: grid size and --jobs


def test_huge_grids_and_more_jobs_than_cpus_are_refused(tmp_path, capsys):
    from fedrcl_flwr.launch.sweep_spec import MAX_SWEEP_RUNS

    sw = _sweep(
        tmp_path,
        grid={
            "client.lr": [0.01 * (i + 1) for i in range(101)],
            "partition.alpha": [0.1 * (i + 1) for i in range(100)],
        },
    )
    t0 = time.time()
    line = _refused(capsys, "sweep", sw, "--dry-run")
    assert "10100 runs" in line and str(MAX_SWEEP_RUNS) in line and time.time() - t0 < 10
    ok = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedprox"]})
    for jobs in (1_000_000_000, (os.cpu_count() or 1) + 1, 0, -1):
        line = _refused(capsys, "sweep", ok, "--jobs", jobs, "--dry-run")
        assert "--jobs" in line and "CPUs" in line
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------- Weak: one line, nothing written


def test_weak_config_inputs_are_one_line(tmp_path, capsys, flower):
    out = tmp_path / "o"
    cases = [
        (["--set", "seed=4294967296"], "'seed'"),
        (["--set", "partition.seed=18446744073709551616"], "'partition.seed'"),
        (["--set", "name=" + "n" * 300], "'name'"),
        (["--set", 'name="bell\\a"'], "'name'"),  # a control character
        (["--set", "model.params={nonsense: 3}"], "model.params"),  # found up front
        (
            ["--set", "model.name=backbone_mlp", "--set", "model.params={backbone: nope}"],
            "model.params.backbone",
        ),
        (
            [
                "--set",
                "model.name=backbone_mlp",
                "--set",
                "model.params={backbone: resnet18, weights: /nonexistent/r18.pth}",
            ],
            "file not found",
        ),
    ]
    for sets, needle in cases:
        line = _refused(capsys, "run", _exp(tmp_path), "--out", out, *sets)
        assert needle in line, (sets, line)
    rec = tmp_path / "rec.yaml"
    rec.write_text(
        yaml.safe_dump(BASE).replace(
            "method: fedavg", "method: fedprox\n  params: &p {mu: 0.1, halve: *p}"
        )
    )
    assert "recursive alias" in _refused(capsys, "run", rec, "--out", out)
    assert not out.exists() and not flower


def test_weak_sweep_inputs_are_one_line(tmp_path, capsys, flower):
    cases = [
        (
            {
                "grid": {"client.method": ["fedavg", "fedprox"]},
                "variants": [{"client.method": "fedprox"}],
            },
            "same key",
        ),
        (
            {
                "grid": {"client.params": [{"mu": 0.1}, {"mu": 0.2}]},
                "variants": [{"client.method": "fedprox", "client.params.mu": 0.3}],
            },
            "same key",
        ),
        ({"grid": {"seed": [1, 2]}, "seeds": [0, 1]}, "'seed'"),
        (
            {"set": {"client.lr": 0.3}, "variants": [{"client.lr": 0.1}, {"client.lr": 0.2}]},
            "same key",
        ),  # dry-run said "every run: client.lr=0.3"
        ({"seeds": [0, 2**32]}, "seeds"),
        ({"grid": {"model.params": [{"width": 3}, {"bogus": 1}]}}, "model.params"),
    ]
    for spec, needle in cases:
        sw = _sweep(tmp_path, **spec)
        line = _refused(capsys, "sweep", sw, "--out", tmp_path / "out")
        assert needle in line, (spec, line)
    assert not (tmp_path / "out").exists() and not flower
    # the sweep's own files in --out must be what they should be
    sw = _sweep(tmp_path, grid={"client.method": ["fedavg", "fedprox"]})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sweep_status.json").mkdir()
    line = _refused(capsys, "sweep", sw, "--out", tmp_path / "out")
    assert "sweep_status.json" in line and not flower


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--save", "DIR"], "--save"),
        (["--save", "FILE/split.json"], "--save"),
        (["--save", "nodir/split.json"], "does not exist"),
        (["--plot", "DIR.png"], "--plot"),
        (["--plot", "FILE/heat.png"], "--plot"),
        (["--max-rows", "-3"], "--max-rows"),
    ],
)
def test_partition_outputs_are_checked_before_any_work(tmp_path, capsys, argv, needle):
    (tmp_path / "DIR").mkdir()
    (tmp_path / "DIR.png").mkdir()
    (tmp_path / "FILE").write_text("a file")
    exp = _exp(tmp_path)
    before = _tree(tmp_path)
    argv = [str(tmp_path / a) if a[0] in "DFn" else a for a in argv]
    rc, out, err = _cli(capsys, "partition", exp, *argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0], err
    assert out == ""  # not even the table: refused before any work
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("target", ["DIR", "FILE/curves", "curves.png-is-a-dir"])
def test_plot_out_onto_a_directory_or_under_a_file(tmp_path, capsys, target):
    d = _run_dir(tmp_path)
    (tmp_path / "DIR.png").mkdir()
    (tmp_path / "FILE").write_text("a file")
    (tmp_path / "curves.png").mkdir()
    out = {
        "DIR": tmp_path / "DIR",
        "FILE/curves": tmp_path / "FILE" / "curves",
        "curves.png-is-a-dir": tmp_path / "curves",
    }[target]
    before = _tree(tmp_path)
    line = _refused(capsys, "plot", d, "--out", out)
    assert "--out" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "S", "--jobs", "many"],
        ["partition", "E", "--max-rows", "x"],
        ["cache", "wipe"],
        ["report"],
        ["run", "E", "--bogus"],
    ],
)
def test_bad_command_lines_are_one_line_too(tmp_path, capsys, argv):
    argv = [str(_exp(tmp_path)) if a in ("S", "E") else a for a in argv]
    with pytest.raises(SystemExit) as ei:
        main(argv)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("fedrcl-flwr: error:")


def test_report_does_not_scan_a_whole_disk_or_follow_links(tmp_path, capsys):
    d = _run_dir(tmp_path / "sweep", "run1")
    (tmp_path / "sweep" / "loop").symlink_to(tmp_path / "sweep")  # a link cycle
    deep = tmp_path / "sweep" / "a" / "b" / "c" / "d" / "e" / "f"
    _run_dir(deep.parent, deep.name)  # deeper than a sweep's runs ever are
    rc, out, err = _cli(capsys, "report", tmp_path / "sweep", "--format", "csv")
    assert rc == 0, err
    assert str(d) in out and str(deep) not in out and "loop" not in out


# ------------------------------------------------------------ Bad 4 + 5, real processes


def _sweep_home(tag: str) -> str:
    """The sweep's private home, from the environment of a run it started."""
    for pid in procs_with(f"FEDRCL_TEST_TAG={tag}"):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"FEDRCL_FLWR_SWEEP="):
                return item.split(b"=", 1)[1].decode()
    return ""


@pytest.mark.slow
@pytest.mark.flwr
def test_kill_9_of_a_sweep_takes_its_runs_with_it(tmp_path, capsys):
    """A sweep holds its --out (a second sweep there: exit 2 naming its PID) and its runs
    die with it however it dies: SIGKILL while a run trains leaves no process of the run
    (CLI, SuperLink, simulation, Ray), and the locks are free again."""
    sw = _sweep(
        tmp_path,
        set={"federation.rounds": 500, "federation.num_clients": 2, "simulation.num_supernodes": 2},
    )
    out = tmp_path / "out"
    tag = uuid.uuid4().hex
    env = {**os.environ, "FEDRCL_TEST_TAG": tag}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedrcl_flwr.cli", "sweep", str(sw), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    run = plan_sweep(sw, out)[0][0].out_dir
    home = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not read_metrics(run):
            time.sleep(0.2)
        assert proc.poll() is None and read_metrics(run), proc.communicate()[0]
        home = (run / LOCK_FILE).read_text().splitlines()[1]
        assert procs_with(home), "the run's processes should be found while it runs"
        line = _refused(capsys, "sweep", sw, "--out", out)  # Bad 4, with a real sweep
        assert f"PID {proc.pid}" in line
        sweep_home = _sweep_home(tag)
        assert sweep_home and Path(sweep_home).is_dir()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        left = alive(home, tag, grace=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in alive(home or tag, tag, grace=0):  # never leave a run behind
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert not left, f"left behind by the killed sweep: {left}"
    assert not Path(home).exists()
    assert OutputLock.holder(out) is None and OutputLock.holder(run) is None
    done = len(read_metrics(run))
    time.sleep(2)
    assert len(read_metrics(run)) == done < 500  # nothing trains on
    assert not Path(sweep_home).exists()  # the sweep's watchdog cleaned up after it
