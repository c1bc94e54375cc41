"""The optional parts of the project (``pip install 'fedrcl-flwr[EXTRA]'``, declared in
``pyproject.toml``'s ``[project.optional-dependencies]``) and the one check whether one is
installed. Every check before a run that needs an extra asks :func:`installed` (a config
that needs a missing extra is one line, exit 2, before any Flower process starts)."""

from __future__ import annotations

import importlib.util

# extra -> the module it installs
EXTRAS: dict[str, str] = {
    "tensorboard": "tensorboard",  # output.tracker: [tensorboard] / output.tensorboard
    "wandb": "wandb",  # output.tracker: [wandb]
    "mlflow": "mlflow",  # output.tracker: [mlflow] (mlflow-skinny)
    "privacy": "dp_accounting",  # privacy.dp's accountant
}
# (the ``timm`` extra is imported where a timm backbone is built,
# fedrcl_flwr/models/backbone.py: an ImportError there names it)


def installed(extra: str) -> bool:
    """Whether ``extra``'s module can be imported (found, not imported: cheap)."""
    return importlib.util.find_spec(EXTRAS[extra]) is not None


def pip_install(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'fedrcl-flwr[{extra}]'"
