"""A sweep key that is no dotted config key (``../x``, ``.client.lr``, ``client..lr``,
``client/lr``, `` client.lr``) is refused naming the key as written and what is wrong
with it, before anything runs; so is such a ``--set`` key."""

from __future__ import annotations

import pytest
import yaml
from helpers import tiny_experiment

from fedrcl_flwr.cli import main


@pytest.mark.parametrize(
    "key, why",
    [
        ("../x", "has an empty name between dots"),
        (".client.lr", "has an empty name between dots"),
        ("client.lr.", "has an empty name between dots"),
        ("client..lr", "has an empty name between dots"),
        ("client/lr", "holds a path separator"),
        (" client.lr", "has spaces around the name ' client'"),
    ],
)
@pytest.mark.parametrize("where", ["grid", "set"])
def test_a_bad_sweep_key_is_named(tmp_path, capsys, key, why, where):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_experiment(tmp_path)))
    sweep = tmp_path / "sweep.yaml"
    value = [0.1, 0.2] if where == "grid" else 0.1
    sweep.write_text(yaml.safe_dump({"base": str(base), where: {key: value}}))
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{sweep}: '{where}' key {key!r} {why}" in err, err
    assert "unknown key ''" not in err
    assert not out.exists()


def test_a_bad_set_key_is_named(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(tiny_experiment(tmp_path)))
    assert main(["run", str(exp), "--set", "../x=1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "override '../x' has an empty name between dots" in err, err
