"""Flower's Control API, called from the CLI's own process.

``flwr run``, ``flwr list --run-id`` and ``flwr log`` are each a new Python process that
imports Flower (about 1 s of CPU apiece on a 2-core machine). The runner asks for a run's
status every few seconds while the run trains, so those processes took CPU from the
clients. This module makes the same calls in-process:

* :func:`submit` is ``flwr run APP CONNECTION --run-config FILE --federation-config ...
  --format json`` — Flower's own command function (``flwr.cli.run.run.run``: it validates
  the app's ``pyproject.toml``, builds the FAB and calls ``StartRun``), run in this process;
* :class:`ControlClient` keeps one HTTP client to the SuperLink's Control API for
  ``ListRuns`` (the run's ``status:sub_status``, as ``flwr list`` shows it) and
  ``StreamLogs`` (the run's log, as ``flwr log --show`` prints it).

Every function takes the run's private ``FLWR_HOME`` (its ``config.toml`` names the
SuperLink connection) and sets it only for the duration of the call. Flower's non-public
API (its CLI functions and Control API messages) comes through
:mod:`fedrcl_flwr.app.wire.flower_private`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

from fedrcl_flwr.app.wire import flower_private


@contextlib.contextmanager
def _flwr_home(home: Path) -> Iterator[None]:
    before = os.environ.get("FLWR_HOME")
    os.environ["FLWR_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FLWR_HOME", None)
        else:
            os.environ["FLWR_HOME"] = before


def submit(
    home: Path, app: Path, connection: str, run_config: Path, federation_config: str
) -> tuple[int | None, str]:
    """Start a run (``flwr run`` in this process); returns ``(run id or None, output)``
    where the output is what ``flwr run`` printed (its error message when the run was not
    started). The default output format is used: Flower's JSON format writes to
    ``sys.__stdout__`` and resets ``sys.stdout``, which cannot be captured."""
    flwr_run = flower_private.cli_run()
    out = io.StringIO()
    with _flwr_home(home), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            flwr_run(
                app=str(app),
                superlink=connection,
                federation=None,
                run_config_overrides=[str(run_config)],
                federation_config_overrides=[federation_config],
                stream=False,
                output_format="default",
            )
        except SystemExit:
            pass
        except Exception as exc:  # noqa: BLE001 - click.ClickException and the like
            out.write(f"\n{type(exc).__name__}: {getattr(exc, 'message', None) or exc}\n")
    text = out.getvalue()
    found = re.search(r"Successfully started run (\d+)", text)
    return (int(found.group(1)) if found else None), text


class ControlClient:
    """One Control API client for the run's SuperLink (``address`` ``host:port``,
    insecure loopback as the runner starts it)."""

    def __init__(self, home: Path, address: str):
        connect = flower_private.control_http_client()
        self.home = Path(home)
        with _flwr_home(self.home), contextlib.redirect_stdout(io.StringIO()):
            self._client = connect(address)

    def status(self, run_id: int) -> str:
        """``status:sub_status`` of the run (``pending``, ``running``,
        ``finished:completed``, ``finished:failed``, ...); ``""`` when it cannot be read."""
        try:
            with _flwr_home(self.home):
                res = self._client.ListRuns(flower_private.list_runs_request(run_id))
        except Exception:  # noqa: BLE001 - a transient failure: ask again later
            return ""
        for proto in res.run_dict.values():
            st = proto.status
            return f"{st.status}:{st.sub_status}" if st.sub_status else str(st.status)
        return ""

    def logs(self, run_id: int) -> str:
        """The run's log from its beginning (what ``flwr log RUN --show`` prints)."""
        parts = []
        try:
            with _flwr_home(self.home):
                for res in self._client.StreamLogs(flower_private.stream_logs_request(run_id)):
                    parts.append(res.log_output)
                    break
        except Exception as exc:  # noqa: BLE001 - the log is a convenience, not a result
            parts.append(f"\n(could not read the run's log: {type(exc).__name__}: {exc})\n")
        return "".join(parts)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()
