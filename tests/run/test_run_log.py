"""``run.log`` as the runner writes it: Flower's coloured console lines without their ANSI
escape sequences, and without Flower's hint that the default number of simulated
SuperNodes changed (the runner always sets it), so the "N simulated SuperNodes" line
stands alone."""

import logging

import pytest

from fedrcl_flwr.runner import readable_log

pytestmark = pytest.mark.unit


def _flower_lines(*records) -> str:
    """The lines Flower's own colouring console handler writes for ``records``."""
    from flwr.supercore.logger import ConsoleHandler

    h = ConsoleHandler(timestamps=False, json=False, colored=True)
    return "".join(
        h.format(logging.LogRecord("flwr", lvl, "x", 1, msg, None, None)) + "\n"
        for lvl, msg in records
    )


def test_run_log_has_no_escapes_and_no_default_size_hint():
    raw = _flower_lines(
        (logging.WARNING, "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2."),
        (logging.INFO, "Federation `local` (5 simulated SuperNodes)"),
        (logging.INFO, "To change federation size, use the following command:"),
        (
            logging.INFO,
            "\tflwr federation simulation-config local <superlink> --num-supernodes <N>",
        ),
        (logging.INFO, "[ROUND 1]"),
    )
    assert "\x1b[" in raw  # Flower's lines are coloured
    assert readable_log(raw) == (
        "INFO :      Federation `local` (5 simulated SuperNodes)\nINFO :      [ROUND 1]\n"
    )


def test_plain_lines_are_kept_as_they_are():
    text = "Traceback (most recent call last):\n  File 'x'\nValueError: bad\n"
    assert readable_log(text) == text
    assert readable_log("a\x1b[1;31mb\x1b[0mc") == "abc"
