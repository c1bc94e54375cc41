"""Every tracker call under a deadline (``output.tracker_timeout_s``): the call runs in a
daemon thread and is abandoned when it does not return in time (:func:`call_with_deadline`);
a dropped tracker is reported on one line (:func:`drop_line`)."""

from __future__ import annotations


class TrackerTimeout(TimeoutError):
    """A tracker call that did not return within ``output.tracker_timeout_s``."""


def call_with_deadline(fn, timeout: float):
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds: its result,
    its exception re-raised, or :class:`TrackerTimeout` (the thread is abandoned: it
    blocks in the tracker's client library, whose own time-out ends it later)."""
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=target, name="fedrcl-tracker-call", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        exc = TrackerTimeout(f"no answer within {timeout:g}s (output.tracker_timeout_s)")
        exc.thread = t  # type: ignore[attr-defined]  # the abandoned call
        raise exc
    if "error" in box:
        raise box["error"]
    return box.get("value")


def drop_line(name: str, what: str, exc: BaseException) -> str:
    one = " ".join(str(exc).split())[:300]
    return (
        f"[fedrcl-flwr] tracker {name} failed while {what} and is dropped "
        f"for the rest of the run ({type(exc).__name__}: {one}); "
        "metrics.jsonl is complete"
    )
