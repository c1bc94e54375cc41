"""The error every input check raises (standard library only, so that the modules that
declare checks — :mod:`fedrcl_flwr.components`, :mod:`fedrcl_flwr.config` — need nothing
else). The CLI turns it into one line on stderr and exit code 2."""

from __future__ import annotations


class ConfigError(ValueError):
    """Raised for any invalid experiment configuration (bad key, type or value)."""


class PartitionError(ConfigError):
    """A partition request that cannot be met (too many clients, min size too large...)."""


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated or holds something other than data."""
