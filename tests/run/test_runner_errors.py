"""The one line a failed run ends with (``fedrcl_flwr/runner.py``): the last traceback's
``Type: message``, and what it means when the runtime failed for a cause outside the
experiment."""

import inspect

from fedrcl_flwr.runner import RAY_NODE_START_TIMEOUT, _one_line_error


def _rays_start_up_message() -> str:
    """Ray's own words when its node does not register in time, read from the installed
    Ray (so that a new wording in Ray fails here, not silently in a user's run)."""
    from ray._private import node

    source = inspect.getsource(node.Node.__init__)
    start = source.index('"The current node timed out during startup')
    pieces = []
    for line in source[start:].splitlines():
        pieces.append(line.strip().strip('"'))
        if line.rstrip().endswith(")"):
            break
    return "".join(pieces).rstrip('")')


def test_the_last_tracebacks_message_is_the_line():
    log = (
        "INFO starting\nTraceback (most recent call last):\n  File 'a.py', line 1\n"
        "ValueError: first\nmore\nTraceback (most recent call last):\n  File 'b.py'\n"
        "RuntimeError: the client raised   on   round 3\nINFO stopped\n"
    )
    assert _one_line_error(log) == "RuntimeError: the client raised on round 3"
    assert _one_line_error("a\n\nlast words  here\n") == "last words here"
    assert _one_line_error("") == "(no log)"


def test_rays_start_up_time_out_is_explained():
    words = _rays_start_up_message()
    assert words.startswith(RAY_NODE_START_TIMEOUT) and "GCS has become overloaded" in words
    log = f"Traceback (most recent call last):\n  File 'ray/node.py'\nException: {words}\n"
    line = _one_line_error(log)
    assert line.startswith(f"Exception: {RAY_NODE_START_TIMEOUT}")
    assert "Ray's node did not start within Ray's fixed 30 s (load average now " in line
    assert "nothing of the experiment ran" in line and "\n" not in line
    assert "fixed 30 s" not in _one_line_error("Traceback\nValueError: bad lr\n")
