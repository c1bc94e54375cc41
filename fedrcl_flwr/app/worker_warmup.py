"""Ray workers of a simulation import the ClientApp's modules as they start.

Flower's Ray backend loads the ClientApp in an actor only when the actor's first message
arrives (``flwr.server.superlink.fleet.vce.backend.raybackend``: ``app_fn`` runs inside
``ClientAppActor.run``): importing torch, torchvision and the project's clients takes
2.3-2.8 s cold on the 2-core machine this is developed on, and it sat on round 1's
critical path, after the ServerApp had sent its messages. Ray runs a
``worker_process_setup_hook`` in every worker process as it starts, which for Flower's
actors is while the ServerApp is still building its model and data. Flower's ``ray.init``
passes a ``runtime_env`` of its own (its ``PYTHONPATH``), so the hook is added through
Ray's ``RAY_RUNTIME_ENV_HOOK``: a function that receives the ``runtime_env`` ``ray.init``
is about to use and returns the one to use. The runner sets that variable for the
simulation's processes only, and only with a private Ray (``fedrcl_flwr.launch.superlink.LocalSuperLink``):
the workers of a Ray cluster (``simulation.ray_address``) start as the cluster starts them.

Nothing is computed early: the same modules are imported, only sooner, so no number of a
run changes. A failed import here is ignored: the real load on the first message raises
it where Flower reports client errors."""

from __future__ import annotations

SETUP_HOOK = "fedrcl_flwr.app.worker_warmup.preload"


def add_setup_hook(runtime_env: dict | None) -> dict:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: the runtime env with :func:`preload` as every
    worker's setup hook (a hook the caller set is kept)."""
    env = dict(runtime_env or {})
    env.setdefault("worker_process_setup_hook", SETUP_HOOK)
    return env


def preload() -> None:
    """Import the ClientApp's module (torch, the clients, the runtime) in this worker, and
    ``torch._dynamo``, which torch imports on a process's first optimizer (0.9 s on the
    2-core machine, inside round 1's first fit otherwise)."""
    try:
        import torch._dynamo  # noqa: F401

        import fedrcl_flwr.app.client_app  # noqa: F401  (the import is the point)
    except Exception:  # reported by the first message's load, with Flower's context
        pass
