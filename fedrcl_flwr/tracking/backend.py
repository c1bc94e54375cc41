"""The writer interface every tracker implements (:class:`Backend`)."""

from __future__ import annotations

from pathlib import Path


class Backend:
    """The writer interface every tracker implements. ``rewrites_after_resume``: the
    backend can take back the rounds after a checkpoint (TensorBoard's ``purge_step``),
    so it gets each record at once; the others only checkpointed rounds."""

    name = ""
    rewrites_after_resume = False

    def state(self) -> dict:
        """What a resumed run needs to continue this backend's run (JSON)."""
        return {}

    def log_round(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def log_results(self, summary: dict, values: dict[str, float], files: list[Path]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def abandon(self, thread=None) -> None:
        """After a failed or timed-out call (``thread``: the abandoned call, if it is
        still running): let go of what the backend holds, without waiting on the service
        that did not answer."""
