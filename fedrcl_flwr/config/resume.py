"""What ``run --resume`` may change in an experiment (:data:`RESUME_MAY_CHANGE`) and the
changes it refuses."""

from __future__ import annotations

from fedrcl_flwr.config.loading import flatten_keys, to_dict
from fedrcl_flwr.config.schema import ExperimentConfig

# What ``run --resume`` may change (dotted keys; a section name covers its keys): how
# long the run goes on, how often it evaluates, checkpoints and reports, and where and
# with what resources it runs. Anything else — method and its params, strategy, data,
# partition, model, seed, local optimisation, EMA, attack settings, name — would make the
# records after the resume those of another experiment, so it is refused.
RESUME_MAY_CHANGE = (
    "federation.rounds",  # not below the rounds already done
    "federation.eval_every",
    "federation.round_timeout_s",
    "federation.max_consecutive_failed_rounds",
    "evaluation.batch_size",
    "evaluation.representation_every",
    "evaluation.local_representation_every",
    "evaluation.robust_every",
    "evaluation.target_rounds",
    "evaluation.report_metric",
    "output",  # dir (always the run's), checkpoints, model, TB
    "simulation",  # resources: CPUs, GPUs, SuperNodes, Ray
    "client.device",
    "dataset.cache_dir",
    "dataset.download",
    "reference",  # the paper's numbers (reporting only)
    "label",  # the report's row name (reporting only)
)


def changed_keys(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """Dotted keys whose resolved value differs between two configurations."""
    a, b = flatten_keys(to_dict(old)), flatten_keys(to_dict(new))
    missing = object()
    return sorted(k for k in set(a) | set(b) if a.get(k, missing) != b.get(k, missing))


def resume_refusals(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """The changed keys that ``run --resume`` refuses (not in :data:`RESUME_MAY_CHANGE`)."""
    return [
        k
        for k in changed_keys(old, new)
        if not any(k == p or k.startswith(p + ".") for p in RESUME_MAY_CHANGE)
    ]
