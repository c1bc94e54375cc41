"""Experiment configuration: a typed schema with defaults, YAML loading, dotted overrides.

An experiment is one YAML file whose top-level sections map onto the dataclasses of
:mod:`~fedrcl_flwr.config.schema`. Every key is checked on load: unknown keys, wrong types
(from the annotations), out-of-range values (each key's declared
:class:`~fedrcl_flwr.components.Rule` in :data:`CONFIG_RULES`) and inconsistent
combinations (the named checks of :data:`CROSS_CHECKS`, in order) raise a single
:class:`ConfigError` that names the offending key and the file it came from.

Method- and strategy-specific parameters live in the mappings ``client.params`` and
``server.params``; their keys and values are checked against the method's / strategy's
declared contract by ``fedrcl_flwr.app.validate`` when the config is loaded.

The package, one module per job (import from here; the modules are the layout):

* :mod:`~fedrcl_flwr.config.schema`  - the dataclasses and their defaults;
* :mod:`~fedrcl_flwr.config.loading` - the YAML and text-file readers, overrides, building
  the schema from a mapping (:func:`load_config`, :func:`config_from_dict`);
* :mod:`~fedrcl_flwr.config.rules`   - each key's allowed values, directory-name rule;
* :mod:`~fedrcl_flwr.config.checks`  - the checks across keys;
* :mod:`~fedrcl_flwr.config.resume`  - what ``run --resume`` may change;
* :mod:`~fedrcl_flwr.config.catalog` - dataset names, partition schemes, report metrics;
* :mod:`~fedrcl_flwr.config.extras`  - which optional extras are installed.
"""

from __future__ import annotations

from fedrcl_flwr.config.checks import (
    CROSS_CHECKS,
    MAX_SUPERNODES,
    REFERENCE_KEYS,
    check_config,
    check_normalize,
    check_reference,
    dataset_channels,
    normalize_constants,
)
from fedrcl_flwr.config.loading import (
    MAX_YAML_BYTES,
    MAX_YAML_NODES,
    apply_overrides,
    config_from_dict,
    dump_config,
    flatten_keys,
    get_key,
    key_problem,
    load_config,
    parse_override,
    parse_yaml,
    read_text_file,
    read_yaml,
    to_dict,
)
from fedrcl_flwr.config.resume import RESUME_MAY_CHANGE, changed_keys, resume_refusals
from fedrcl_flwr.config.rules import CONFIG_RULES, MAX_NAME_BYTES, _shorten, name_problem
from fedrcl_flwr.config.schema import (
    AvailabilityConfig,
    ClientConfig,
    DatasetConfig,
    DPConfig,
    EvaluationConfig,
    ExperimentConfig,
    FederationConfig,
    ModelConfig,
    OutputConfig,
    PartitionConfig,
    PerClientEvalConfig,
    PrivacyConfig,
    ServerConfig,
    SimulationConfig,
    StragglerConfig,
    SyntheticConfig,
)
from fedrcl_flwr.errors import ConfigError

__all__ = [
    "CONFIG_RULES",
    "CROSS_CHECKS",
    "MAX_NAME_BYTES",
    "MAX_SUPERNODES",
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "REFERENCE_KEYS",
    "RESUME_MAY_CHANGE",
    "AvailabilityConfig",
    "ClientConfig",
    "ConfigError",
    "DPConfig",
    "DatasetConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "FederationConfig",
    "ModelConfig",
    "OutputConfig",
    "PartitionConfig",
    "PerClientEvalConfig",
    "PrivacyConfig",
    "ServerConfig",
    "SimulationConfig",
    "StragglerConfig",
    "SyntheticConfig",
    "_shorten",
    "apply_overrides",
    "key_problem",
    "changed_keys",
    "check_config",
    "check_normalize",
    "check_reference",
    "config_from_dict",
    "dataset_channels",
    "dump_config",
    "flatten_keys",
    "get_key",
    "load_config",
    "name_problem",
    "normalize_constants",
    "parse_override",
    "parse_yaml",
    "read_text_file",
    "read_yaml",
    "resume_refusals",
    "to_dict",
]
