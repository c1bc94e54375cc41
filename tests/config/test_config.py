"""Experiment schema: defaults, overrides, and one clear error per bad input."""

import subprocess
import sys
from pathlib import Path

import pytest

from fedrcl_flwr.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    config_from_dict,
    dump_config,
    load_config,
)

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_valid():
    cfg = config_from_dict({})
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.federation.sampled_per_round() == 5  # 5 % of 100


def test_quickstart_loads():
    cfg = load_config(ROOT / "experiments" / "quickstart.yaml")
    assert cfg.dataset.name == "synthetic"
    assert cfg.partition.scheme == "dirichlet" and cfg.partition.alpha == 0.3
    assert cfg.federation.num_clients == 100


def test_overrides_apply_and_parse_yaml_scalars(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("name: x\nclient: {lr: 0.1}\n")
    cfg = load_config(
        p,
        [
            "client.lr=0.05",
            "partition.balanced=false",
            "evaluation.target_rounds=[10, 20]",
            "dataset.image_size=null",
        ],
    )
    assert cfg.client.lr == 0.05
    assert cfg.partition.balanced is False
    assert cfg.evaluation.target_rounds == [10, 20]
    assert cfg.dataset.image_size is None


def test_int_accepted_for_float():
    cfg = config_from_dict({"client": {"lr": 1}})
    assert isinstance(cfg.client.lr, float)


def test_resolved_config_roundtrip(tmp_path):
    cfg = load_config(ROOT / "experiments" / "quickstart.yaml", ["client.lr=0.07"])
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg


BAD = [
    ({"bogus": 1}, "'bogus'"),
    ({"client": {"lrr": 0.1}}, "'client.lrr'"),
    ({"partition": {"alpha": 0}}, "'partition.alpha'"),
    ({"partition": {"alpha": -0.5}}, "'partition.alpha'"),
    ({"federation": {"participation": 0}}, "'federation.participation'"),
    ({"federation": {"participation": 1.5}}, "'federation.participation'"),
    ({"federation": {"rounds": 0}}, "'federation.rounds'"),
    ({"federation": {"num_clients": "ten"}}, "'federation.num_clients'"),
    ({"federation": {"num_clients": 1.5}}, "'federation.num_clients'"),
    ({"client": {"lr": "fast"}}, "'client.lr'"),
    ({"client": {"lr": -0.1}}, "'client.lr'"),
    ({"client": {"local_epochs": 0}}, "'client.local_epochs'"),
    ({"client": {"grad_clip": 0}}, "'client.grad_clip'"),
    ({"partition": {"scheme": "random"}}, "'partition.scheme'"),
    ({"dataset": {"name": "imagenet21k"}}, "'dataset.name'"),
    ({"dataset": {"name": "npz"}}, "'dataset.path'"),
    ({"model": {"name": "vgg99"}}, "'model.name'"),
    ({"evaluation": {"ema": 1.0}}, "'evaluation.ema'"),
    ({"evaluation": {"target_rounds": [0, 5]}}, "'evaluation.target_rounds'"),
    ({"server": {"weighting": "median"}}, "'server.weighting'"),
    ({"federation": {"clients_per_round": 200, "num_clients": 100}}, "clients_per_round"),
    ({"partition": {"balanced": "yes"}}, "'partition.balanced'"),
    ({"simulation": {"num_gpus": -1}}, "'simulation.num_gpus'"),
    ({"client": "sgd"}, "'client'"),
    ({"partition": {"scheme": "domain"}}, "num_domains"),
]


@pytest.mark.parametrize("data,needle", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_input_names_key_and_file(data, needle):
    with pytest.raises(ConfigError) as ei:
        config_from_dict(data, "exp.yaml")
    msg = str(ei.value)
    assert needle in msg
    assert msg.startswith("exp.yaml")
    assert "\n" not in msg


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["client.lr"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"client": {"lr": 0.1}}, ["client.lr.x=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fedrcl_flwr.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "experiments/quickstart.yaml", "--set", "partition.alpha=0"], "partition.alpha"),
        (["run", "experiments/quickstart.yaml", "--set", "client.method=nope"], "client.method"),
        (
            ["run", "experiments/quickstart.yaml", "--set", "server.strategy=nope"],
            "server.strategy",
        ),
        (["run", "experiments/quickstart.yaml", "--set", "client.params={mu: 1}"], "client.params"),
        (["run", "does/not/exist.yaml"], "not found"),
        (["run", "experiments/quickstart.yaml", "--set", "oops"], "key=value"),
        (["report", "/nonexistent/run"], "summary.json"),
    ],
)
def test_cli_bad_input_exit_2_without_traceback(args, needle):
    res = _cli(*args)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
    assert "Traceback" not in res.stderr


# ------------------------------------------------- the declared rules of the config keys
def _rule_cases():
    from fedrcl_flwr.config import CONFIG_RULES

    return [
        pytest.param(key, bad, id=f"{key}={bad!r}"[:60])
        for key, rule in CONFIG_RULES.items()
        for bad in rule.bad
    ]


def _with(key: str, value) -> dict:
    data: dict = {}
    if key.startswith("privacy.dp."):  # a key of the optional privacy.dp section
        data["privacy"] = {"dp": {"noise_multiplier": 1.0, "clipping_norm": 1.0}}
    node = data
    for part in key.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[key.split(".")[-1]] = value
    return data


def test_every_rule_declares_invalid_examples():
    """Each key's rule (``CONFIG_RULES``) names a key of the schema and carries values it
    refuses, so the walk below cannot pass by testing nothing."""
    from fedrcl_flwr.config import CONFIG_RULES, get_key

    cfg = config_from_dict(_with("privacy.dp.mode", "server"))
    for key, rule in CONFIG_RULES.items():
        get_key(cfg, key)  # a real key (AttributeError otherwise)
        assert rule.bad, f"{key}: no invalid example"
        assert not any(rule.ok(b) for b in rule.bad), key


@pytest.mark.parametrize("key,bad", _rule_cases())
def test_each_rule_refuses_its_invalid_examples(key, bad):
    """Every declared rule of a config key, walked: each invalid example is one
    ConfigError naming the key, the rule's words and the file."""
    from fedrcl_flwr.config import CONFIG_RULES

    with pytest.raises(ConfigError) as ei:
        config_from_dict(_with(key, bad), "rules.yaml")
    msg = str(ei.value)
    assert msg.startswith("rules.yaml: ") and f"'{key}'" in msg, msg
    assert CONFIG_RULES[key].text in msg, msg


def test_domain_mean_report_metrics_are_accepted_and_checked():
    """``evaluation.report_metric`` takes the domain means (the papers' "Avg"); an
    ``ema@ROUND_domain_mean`` needs ROUND among the target rounds as ``ema@ROUND`` does;
    a pooled metric of an inter-domain experiment is reported as its domain mean."""
    from fedrcl_flwr.config.catalog import reported_metric

    for m in ("last5_domain_mean", "final_domain_mean", "best_domain_mean"):
        assert config_from_dict({"evaluation": {"report_metric": m}}).evaluation.report_metric == m
    ok = {"evaluation": {"report_metric": "ema@7_domain_mean", "target_rounds": [7]}}
    assert config_from_dict(ok).evaluation.report_metric == "ema@7_domain_mean"
    with pytest.raises(ConfigError, match="target_rounds"):
        config_from_dict({"evaluation": {"report_metric": "ema@7_domain_mean"}}, "e.yaml")
    assert reported_metric("last5", "domain") == "last5_domain_mean"
    assert reported_metric("ema@7", "domain") == "ema@7_domain_mean"
    assert reported_metric("last5", "dirichlet") == "last5"
    assert reported_metric("last5_domain_mean", "domain") == "last5_domain_mean"
