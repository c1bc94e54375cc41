"""What a tracker needs outside the config (a W&B API key, an answering MLflow server),
checked before anything runs (:func:`check_tracker_environment`)."""

from __future__ import annotations

import os

from fedrcl_flwr.config.sections import enabled_trackers


def check_tracker_environment(cfg) -> None:
    """What a tracker needs outside the config, checked before anything runs (a
    ``ConfigError``, exit 2): W&B online needs an API key; an ``http(s)`` MLflow tracking
    server must accept a connection."""
    from fedrcl_flwr.errors import ConfigError

    names = enabled_trackers(cfg)
    if (
        "wandb" in names
        and os.environ.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun")
        and not _wandb_key_present()
    ):
        raise ConfigError(
            "output.tracker includes wandb in online mode but no W&B API key "
            "is set (run `wandb login` or set WANDB_API_KEY; or "
            "WANDB_MODE=offline to log locally and `wandb sync` later)"
        )
    if "mlflow" in names:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if uri.startswith(("http://", "https://")):
            import socket
            from urllib.parse import urlparse

            u = urlparse(uri)
            port = u.port or (443 if u.scheme == "https" else 80)
            try:
                with socket.create_connection((u.hostname, port), timeout=3):
                    pass
            except OSError as exc:
                raise ConfigError(
                    f"output.tracker includes mlflow but the tracking server "
                    f"MLFLOW_TRACKING_URI={uri} does not answer "
                    f"({exc.strerror or exc})"
                ) from None


def _wandb_key_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        # netrc looks a None host up like any other (then its `default` entry)
        return netrc.netrc().authenticators(host) is not None  # type: ignore[arg-type]
    except (OSError, netrc.NetrcParseError):
        return False
