"""Fixtures and hooks of the whole suite (the shared harness is ``tests/helpers.py``): the
test doubles registered, the dataset cache and ``$TMPDIR`` of the session, the markers
set by place, no network."""

import socket
from pathlib import Path

import pytest
from helpers import SESSION, TEST_DOUBLES, tiny_config

ROOT = Path(__file__).resolve().parents[1]

_ENV_BEFORE: dict = {}


def pytest_configure(config):
    """Register the test doubles (the ``faulty`` client method, ``clients/faulty.py``) in
    this process and, through ``EXTRA_COMPONENTS_ENV``, in every process a test starts
    (``fedrcl-flwr run``, ``flwr run``, SuperNodes, Ray's workers inherit it)."""
    import json
    import os

    from fedrcl_flwr.components import EXTRA_COMPONENTS_ENV

    _ENV_BEFORE["value"] = os.environ.get(EXTRA_COMPONENTS_ENV)
    os.environ[EXTRA_COMPONENTS_ENV] = json.dumps(TEST_DOUBLES)
    from clients import CLIENTS

    for name, target in TEST_DOUBLES["client.method"].items():
        CLIENTS.register(name, target)


# markers (CONTRIBUTING, "Tests"): a test marked ``flwr`` starts real Flower processes and
# is ``integration``; ``slow`` (set by the test itself) puts a ``flwr`` test in the
# extended tier the default run leaves out (pyproject's addopts: ``-m "not slow"``); a test
# that runs a whole experiment (in process or through the CLI) says so with
# ``integration`` wherever it lives; the directories whose tests drive the CLI or Flower's
# adapters are ``integration``; every other test is ``unit`` (the fast subset:
# ``python -m pytest -m unit``), and a ``unit`` test that starts a whole run fails
# (:func:`_unit_tests_run_no_experiment`)
INTEGRATION_DIRS = frozenset({"app", "cli", "e2e", "run"})
TESTS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            place = Path(str(item.path)).resolve().relative_to(TESTS_DIR).parts[0]
        except ValueError:
            place = ""
        if item.get_closest_marker("slow") is not None:
            if item.get_closest_marker("flwr") is None:
                raise pytest.UsageError(
                    f"{item.nodeid}: only a test that starts real Flower processes (flwr) is slow"
                )
        if item.get_closest_marker("flwr") is not None:
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("integration") is not None:
            continue
        elif place in INTEGRATION_DIRS:
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


# every whole run passes through one of these: the in-process runner builds its server,
# the CLI's ``run`` (and each run of a sweep) hands the experiment to Flower
WHOLE_RUN_ENTRIES = (
    ("fedrcl_flwr.app.inprocess", "build_server"),
    ("fedrcl_flwr.runner", "run_simulation_via_flower"),
)


@pytest.fixture(autouse=True)
def _unit_tests_run_no_experiment(request, monkeypatch):
    """``unit`` means fast and in process: a ``unit`` test that starts a whole run fails
    with one line saying how to mark it (``@pytest.mark.integration``)."""
    import sys

    if request.node.get_closest_marker("integration") is not None:
        return
    where = request.node.nodeid

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{where} is a `unit` test but starts a whole run: mark it "
            "@pytest.mark.integration (or its module: pytestmark = pytest.mark.integration)"
        )

    for module, name in WHOLE_RUN_ENTRIES:
        if module in sys.modules:  # (a module first imported inside the test goes unguarded)
            monkeypatch.setattr(sys.modules[module], name, refuse)


def pytest_unconfigure(config):
    import os

    from fedrcl_flwr.components import EXTRA_COMPONENTS_ENV

    if _ENV_BEFORE.get("value") is None:
        os.environ.pop(EXTRA_COMPONENTS_ENV, None)
    else:
        os.environ[EXTRA_COMPONENTS_ENV] = _ENV_BEFORE["value"]


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache_dir(tmp_path_factory):
    """The suite's dataset cache is a temporary directory, never the user's cache (real
    `fedrcl-flwr run` subprocesses inherit the variable)."""
    import os

    from fedrcl_flwr.data.cache.layout import ENV_VAR

    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = str(tmp_path_factory.mktemp("dataset-cache"))
    yield
    if before is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = before


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"test tried to use the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def tiny(tmp_path):
    return lambda **kw: tiny_config(tmp_path, **kw)


@pytest.fixture(autouse=True, scope="session")
def _session_tmpdir(tmp_path_factory):
    """The suite's processes are marked as the runner marks a run's: every run started by
    a test (in process or as a subprocess, which inherits the variable) makes its private
    home with ``tempfile`` under ``$TMPDIR``, so with ``TMPDIR`` set to a directory of this
    session, every process of a run the tests started — the SuperLink, the simulation
    process, Ray's workers and agents (found by their command line or working directory)
    — names ``<session dir>/fedrcl-flwr-home-``, and processes of anyone else's runs on
    the machine never do (``helpers.leftover_procs`` judges only ours). The homes under it
    are too long a path for Ray's sockets, so Ray keeps its session files under
    ``$TMPDIR/ray`` (``fedrcl_flwr.launch.superlink.ray_sockets_fit``), removed with the directory. pytest's own temporary directories are fixed
    first and stay where they were; the directory is removed at the end."""
    import os
    import shutil
    import tempfile

    tmp_path_factory.getbasetemp()
    before = os.environ.get("TMPDIR")
    mine = Path(tempfile.mkdtemp(prefix="fedrcl-tests-"))  # short: Ray's socket paths
    os.environ["TMPDIR"] = str(mine)
    tempfile.tempdir = None  # recomputed from $TMPDIR
    SESSION["tmp"] = mine
    yield mine
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
    shutil.rmtree(mine, ignore_errors=True)
