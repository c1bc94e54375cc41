"""The method contract, enumerated from the registries (a new method or strategy is covered
without touching this file):

* every declared ``client.params`` / ``server.params`` key of every registered method and
  strategy (and every ``server.signals`` key of the signal exchange) rejects values of the wrong type, non-finite numbers and each rule's invalid
  examples through the real CLI (``fedrcl-flwr run --set ...``, in process): exit 2, one
  line naming the key and the file, nothing written and no Flower process started;
* the same config without the bad value is accepted (so the rejection is the value's);
* every number / string / list parameter declares its allowed values (``rules``).
"""

from __future__ import annotations

import math

import pytest
import yaml

from clients import CLIENTS, client_class
from fedrcl_flwr import cli, runner
from fedrcl_flwr.app.validate import validate_components
from fedrcl_flwr.components import type_violations
from fedrcl_flwr.config import ConfigError, config_from_dict
from fedrcl_flwr.server.signal_exchange import SignalExchange
from strategies import STRATEGIES, strategy_class

BASE = {
    "name": "contract",
    "dataset": {
        "name": "synthetic",
        "synthetic": {"num_train": 200, "num_test": 50, "num_classes": 4, "image_size": 16},
    },
    "model": {"name": "cnn5"},
    "federation": {"num_clients": 4, "rounds": 1, "participation": None, "clients_per_round": 2},
    "client": {"method": "fedavg", "device": "cpu"},
    "server": {"strategy": "fedavg"},
}


def _components():
    """(section, name, class) for every registered method and strategy, and the signal
    exchange (``server.signals``, configured with a signal method)."""
    out = [("client.params", m, client_class(m)) for m in sorted(CLIENTS)]
    out += [("server.params", s, strategy_class(s)) for s in sorted(STRATEGIES)]
    return out + [("server.signals", "fedccl", SignalExchange)]


def _config(section: str, name: str) -> dict:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    if section != "server.params":
        cls = client_class(name)
        data["client"]["method"] = name
        data["server"]["strategy"] = (cls.strategies or ("fedavg",))[0]
        if name == "univarfl":  # its model has the paper's projector (check_config)
            data["model"] = {"name": "cnn5", "params": {"projector": 32}}
    else:
        data["server"]["strategy"] = name
    return data


def _bad_values(cls, key):
    rule = cls.rules.get(key)
    return type_violations(cls.defaults[key]) + list(rule.bad if rule else ())


def _yaml(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text[:-3].strip() if text.endswith("...") else text


def _cases():
    cases = []
    for section, name, cls in _components():
        for key in sorted(cls.defaults):
            for bad in _bad_values(cls, key):
                cases.append(
                    pytest.param(section, name, key, bad, id=f"{section}:{name}.{key}={_yaml(bad)}")
                )
    return cases


@pytest.mark.parametrize("section,name,cls", _components(), ids=lambda v: str(v)[:20])
def test_the_unchanged_config_is_valid(section, name, cls):
    validate_components(config_from_dict(_config(section, name), "contract.yaml"))


@pytest.mark.parametrize("section,name,cls", _components(), ids=lambda v: str(v)[:20])
def test_every_parameter_declares_its_allowed_values(section, name, cls):
    assert set(cls.rules) <= set(cls.defaults), "a rule for an undeclared parameter"
    for key, default in cls.defaults.items():
        if isinstance(default, bool):
            continue  # true/false: the type is the whole rule
        assert key in cls.rules, f"{section}.{key} of {name} declares no rule"
        assert _bad_values(cls, key), key


@pytest.mark.parametrize(
    "registry,load",
    [(CLIENTS, client_class), (STRATEGIES, strategy_class)],
    ids=["client.method", "server.strategy"],
)
def test_every_class_declares_its_own_name_and_parameters(registry, load):
    """The registry names each class by what the class says it is (``method`` /
    ``name``), and a class with parameters declares them itself, in its own body (so a
    subclass that forgot its declaration cannot silently take its parent's: FedSCL
    declares FedRCL's parameters less ``beta`` and ``lam``)."""
    assert registry.builtin
    attr = "method" if registry is CLIENTS else "name"
    for name in registry.builtin:
        cls = load(name)
        assert getattr(cls, attr) == name, name
        defaults, rules = registry.params(name)
        assert (defaults, rules) == (cls.defaults, cls.rules), name
        if defaults:
            assert "defaults" in vars(cls) and "rules" in vars(cls), name


@pytest.fixture
def no_flower(monkeypatch):
    """Fail the test if the CLI gets as far as starting Flower."""
    import subprocess

    def boom(*a, **k):
        raise AssertionError("a Flower process was about to start")

    monkeypatch.setattr(runner, "run_simulation_via_flower", boom)
    monkeypatch.setattr(subprocess, "Popen", boom)


@pytest.mark.parametrize("section,name,key,bad", _cases())
def test_bad_value_stops_the_cli_with_exit_2(tmp_path, capsys, no_flower, section, name, key, bad):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_config(section, name)))
    out = tmp_path / "out"
    rc = cli.main(["run", str(path), "--set", f"{section}.{key}={_yaml(bad)}", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert f"{section}.{key}" in err and str(path) in err, err
    assert not out.exists()


def test_messages_say_what_is_allowed(tiny):
    cases = [
        (
            {"client": {"method": "fedccl", "params": {"local_signal": "clusters"}}},
            "client.params.local_signal for method 'fedccl' must be one of cluster, mean",
        ),
        (
            {"client": {"method": "fedrcl", "params": {"tau": 0}}},
            "client.params.tau for method 'fedrcl' must be > 0, got 0.0",
        ),
        (
            {"client": {"method": "fedrcl", "params": {"levels": ["nonexistent"]}}},
            "unknown level(s) ['nonexistent']; this model has ['conv1', 'conv2', 'fc1', "
            "'penultimate']",
        ),
        (
            {"client": {"method": "fedprox", "params": {"mu": -1}}},
            "client.params.mu for method 'fedprox' must be >= 0, got -1.0",
        ),
        (
            {"server": {"strategy": "fedavgm", "params": {"momentum": -5}}},
            "server.params.momentum for strategy 'fedavgm' must be in [0, 1), got -5.0",
        ),
        (
            {"server": {"strategy": "fedadam", "params": {"server_lr": math.nan}}},
            "server.params.server_lr for strategy 'fedadam' must be finite, got nan",
        ),
        (
            {"client": {"method": "fedmlb", "params": {"branches": [7]}}},
            "client.params.branches for method 'fedmlb': [7] not in [0, 4)",
        ),
        (
            {"client": {"method": "univarfl", "params": {"feature": "projecter"}}},
            "unknown feature 'projecter'",
        ),
        (
            {"client": {"method": "fedproc", "params": {"alpha": 1.5}}},
            "must be in [0.0, 1.0] (or -1.0), got 1.5",
        ),
        (
            {"client": {"method": "fedccl"}, "server": {"signals": {"max_age": 0}}},
            "server.signals.max_age for the signal exchange must be >= 1, got 0",
        ),
    ]
    for sections, message in cases:
        with pytest.raises(ConfigError) as exc:
            validate_components(tiny(**sections))
        assert message in str(exc.value), str(exc.value)
    # sentinels and boundary values that are allowed
    for sections in (
        {"client": {"method": "fedproc", "params": {"alpha": -1}}},
        {"client": {"method": "fedproc", "params": {"alpha": 1}}},
        {"client": {"method": "fedrcl", "params": {"levels": ["last"]}}},
        {"client": {"method": "fedmlb", "params": {"branches": [0, 3]}}},
        {"server": {"strategy": "fedavgm", "params": {"momentum": 0}}},
    ):
        validate_components(tiny(**sections))


def test_ints_are_not_floats_and_floats_become_floats(tiny):
    cls = client_class("fedrcl")
    p = cls.resolve(tiny(client={"method": "fedrcl", "params": {"tau": 1, "topk_pos": 3}}))
    assert isinstance(p["tau"], float) and p["topk_pos"] == 3
    with pytest.raises(ConfigError, match="topk_pos .* must be a whole number"):
        cls.resolve(tiny(client={"method": "fedrcl", "params": {"topk_pos": 3.0}}))


def test_univarfl_without_its_projector_is_refused_in_one_line(tmp_path, capsys, no_flower):
    """UniVarFL's paper model has a two-layer projector (without it the method
    sat at chance): a config without ``model.params.projector`` stops the CLI (exit 2,
    one line naming the key and the file, nothing written); 256, or 0 on purpose, pass."""
    data = _config("client.params", "univarfl")
    data["model"] = {"name": "cnn5"}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert cli.main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.params.projector" in err, err
    assert str(path) in err and not out.exists()
    for width in (256, 0):
        cfg = config_from_dict(
            {**data, "model": {"name": "cnn5", "params": {"projector": width}}}, "x"
        )
        validate_components(cfg)


def test_faulty_is_a_test_double_registered_by_the_tests_only(monkeypatch):
    """``faulty`` is not in the package's registry; the suite registers it (conftest.py),
    in this process and, through the environment, in the processes a run starts."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from fedrcl_flwr.components import EXTRA_COMPONENTS_ENV, extra_components

    assert "faulty" not in CLIENTS.builtin and client_class("faulty").method == "faulty"
    probe = (
        "from clients import CLIENTS, client_class; print(sorted(set(CLIENTS) - "
        "CLIENTS.builtin), 'faulty' in CLIENTS.builtin); "
        "print(client_class('faulty').__name__ if 'faulty' in CLIENTS else '-')"
    )
    env = {k: v for k, v in os.environ.items() if k != EXTRA_COMPONENTS_ENV}
    root = Path(__file__).resolve().parents[2]
    out = [
        subprocess.run(
            [sys.executable, "-c", probe],
            env=e,
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
        ).stdout
        for e in (env, {**env, EXTRA_COMPONENTS_ENV: os.environ[EXTRA_COMPONENTS_ENV]})
    ]
    assert out == ["[] False\n-\n", "['faulty'] False\nFaultyClient\n"]
    monkeypatch.setenv(EXTRA_COMPONENTS_ENV, "{not json")
    with pytest.raises(ConfigError, match=EXTRA_COMPONENTS_ENV):
        extra_components("client.method")
