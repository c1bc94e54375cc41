"""Every experiment YAML under experiments/ is a complete, valid experiment.

* each file loads with ``load_config`` and passes ``validate_components`` (method, strategy,
  their parameters, signal exchange);
* every ``--set`` command documented in a file's header comment (the paper rows: "run a row
  with the --set shown") is itself a valid experiment (a method that is not registered
  fails the test);
* ``experiments/baselines/synthetic_all.yaml`` is valid for every registered method;
* table files name their paper and table; the synthetic CPU files use the synthetic data;
  no file points at an absolute path of some machine.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from clients import CLIENTS
from fedrcl_flwr.app.validate import validate_components
from fedrcl_flwr.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
FILES = sorted(
    p for p in EXPERIMENTS.rglob("*.yaml") if "sweeps" not in p.relative_to(EXPERIMENTS).parts
)  # sweeps: test_sweep.py
PAPER_DIRS = ("fedrcl", "univarfl", "fedccl")
PAPER_NAMES = {"fedrcl": "FedRCL", "univarfl": "UniVarFL", "fedccl": "FedCCL"}


def _rel(p: Path) -> str:
    return str(p.relative_to(EXPERIMENTS))


def _header(path: Path) -> list[str]:
    """The leading comment block of a file (without the '#')."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        out.append(line[1:].strip())
    return out


def _documented_overrides(path: Path) -> list[tuple[str, list[str]]]:
    """(line, overrides) for every header line with ``--set KEY=VALUE`` examples."""
    found = []
    for line in _header(path):
        if "--set" not in line:
            continue
        text = line[line.index("--set") :]
        try:
            tokens = shlex.split(text)
        except ValueError:
            tokens = text.split()
        sets = []
        for i, tok in enumerate(tokens[:-1]):
            if tok != "--set":
                continue
            value = tokens[i + 1].rstrip(".,;)")
            if "=" not in value or "$" in value or "..." in value:
                continue
            sets.append(value)
        if sets:
            found.append((line, sets))
    return found


def test_there_are_experiments():
    names = {_rel(p) for p in FILES}
    assert "quickstart.yaml" in names
    for sub in PAPER_DIRS:
        assert f"{sub}/synthetic_cpu.yaml" in names
        assert any(n.startswith(f"{sub}/table") for n in names), sub
    assert "baselines/synthetic_all.yaml" in names


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_experiment_is_valid(path):
    cfg = load_config(path)
    validate_components(cfg)
    assert cfg.name and "/" not in cfg.name


def _override_cases():
    cases = []
    for path in FILES:
        for _line, sets in _documented_overrides(path):
            cases.append(pytest.param(path, sets, id=f"{_rel(path)}::{' '.join(sets)}"))
    return cases


@pytest.mark.parametrize("path,overrides", _override_cases())
def test_documented_override_is_valid(path, overrides):
    cfg = load_config(path, overrides)
    validate_components(cfg)


SYNTHETIC_ALL = EXPERIMENTS / "baselines" / "synthetic_all.yaml"
ALL_METHODS = sorted(m for m in CLIENTS if m != "faulty")


@pytest.mark.parametrize("method", ALL_METHODS)
def test_synthetic_all_is_valid_for_every_method(method):
    strategy = "feddyn" if method == "feddyn" else "fedavg"  # as the file's loop
    projector = 256 if method == "univarfl" else 0
    cfg = load_config(
        SYNTHETIC_ALL,
        [
            f"client.method={method}",
            f"server.strategy={strategy}",
            f"model.params.projector={projector}",
            f"name=synthetic_all_{method}",
        ],
    )
    validate_components(cfg)


def test_synthetic_all_loop_names_every_method():
    text = "\n".join(_header(SYNTHETIC_ALL))
    loop = set(re.findall(r"[a-z]+", text[text.index("for m in") : text.index("; do")]))
    missing = set(ALL_METHODS) - loop
    assert not missing, f"synthetic_all.yaml's loop misses {sorted(missing)}"


@pytest.mark.parametrize("sub", PAPER_DIRS)
def test_synthetic_cpu_files_use_synthetic_data(sub):
    cfg = load_config(EXPERIMENTS / sub / "synthetic_cpu.yaml")
    assert cfg.dataset.name == "synthetic"
    assert cfg.client.device == "cpu"
    assert cfg.federation.rounds <= 40
    assert load_config(SYNTHETIC_ALL).dataset.name == "synthetic"


def test_fedrcl_synthetic_logs_representation_metrics():
    cfg = load_config(EXPERIMENTS / "fedrcl" / "synthetic_cpu.yaml")
    assert cfg.evaluation.representation_every > 0
    assert cfg.client.method == "fedrcl"


TABLE_FILES = [p for p in FILES if p.parent.name in PAPER_DIRS and p.name.startswith("table")]


@pytest.mark.parametrize("path", TABLE_FILES, ids=_rel)
def test_table_file_names_its_paper_table(path):
    head = _header(path)
    assert head, "no header comment"
    first = " ".join(head[:3])
    assert PAPER_NAMES[path.parent.name] in first
    assert re.search(r"\bTable [0-9A-D]\b", first), first
    assert any(re.search(r"\d+\.\d+", line) for line in head), "no paper numbers"
    assert "(this file)" in "\n".join(head), "the paper row this file runs is not marked"


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_paths_are_user_relative(path):
    cfg = load_config(path)
    paths = [cfg.dataset.root, cfg.dataset.path, cfg.model.params.get("weights"), cfg.output.dir]
    for p in paths:
        if p:
            assert not str(p).startswith("/"), f"absolute path {p!r}"


def test_fedccl_inter_domain_files_use_the_backbone_placeholder():
    for path in FILES:
        if path.parent.name != "fedccl" or not path.name.startswith("table"):
            continue
        cfg = load_config(path)
        if cfg.dataset.name in ("digit5", "imagefolder"):
            assert cfg.partition.scheme == "domain"
            assert cfg.model.name == "backbone_mlp"
            assert cfg.model.params["weights"].startswith("~")
            assert "PLACEHOLDER" in path.read_text()
