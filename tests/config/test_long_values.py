"""A value of 100,000 characters is never echoed whole: the refusal names the key and
shows the value's start and its length, on one short line."""

import pytest
import yaml
from helpers import tiny_experiment

from fedrcl_flwr.cli import main

LONG = "x" * 100_000


@pytest.mark.parametrize(
    "key, says",
    [
        ("label", "'label' must be one line of printable text"),
        ("client.lr", "'client.lr' must be float, got str"),
        ("model.name", "'model.name' must be one of"),
        ("client.method", "'client.method' must be one of"),
        ("dataset.normalize", "'dataset.normalize'"),
    ],
)
def test_a_long_value_is_cut_in_the_refusal(tmp_path, capsys, key, says):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(tiny_experiment(tmp_path)))
    assert main(["run", str(exp), "--set", f"{key}={LONG}", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err and str(exp) in err, err[:500]
    assert len(err) < 1200, len(err)
    assert "100,002 characters)" in err  # repr's quotes: 100,002


def test_one_line_keeps_head_and_tail():
    from fedrcl_flwr.errors import one_line, shown

    assert shown("abc") == "'abc'"
    assert shown("y" * 500, 20) == "'" + "y" * 19 + "... (502 characters)"
    text = "head " + "z" * 10_000 + " tail"
    line = one_line(text, 2000)
    assert line.startswith("head ") and line.endswith(" tail") and len(line) < 2100
    assert "characters left out" in line
    assert one_line("a\n  b") == "a b"
