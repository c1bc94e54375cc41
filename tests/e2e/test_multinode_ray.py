"""A real two-node Ray cluster on loopback: `simulation.ray_address` makes the simulation
join it, virtual clients run on both nodes (from the run's records), and nothing of the
run or of the cluster is left afterwards (the cluster is stopped by PID, never `ray stop`,
which would stop every Ray on the machine)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import leftover_procs, stop_process_groups

from fedrcl_flwr.launch.processes import procs_with
from fedrcl_flwr.launch.superlink import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.flwr


def _ports() -> list[str]:
    """Every port a Ray node would otherwise take from a fixed default (two nodes on one
    host must not collide, nor with any other Ray on the machine)."""
    args = []
    for flag in (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    ):
        args += [flag, str(free_port())]
    return args


@pytest.fixture
def two_node_cluster(tmp_path):
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    if not Path(ray).exists():
        pytest.skip("the ray command is not installed")
    marker = f"fedrcl-test-ray-{uuid.uuid4().hex[:10]}"
    env = dict(os.environ, FEDRCL_TEST_RAY=marker, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    common = [
        "--block",
        "--num-cpus",
        "1",
        "--node-ip-address",
        "127.0.0.1",
        "--disable-usage-stats",
    ]
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    ray,
                    "start",
                    "--head",
                    "--port",
                    str(port),
                    "--include-dashboard",
                    "false",
                    "--ray-client-server-port",
                    str(free_port()),
                    "--temp-dir",
                    str(Path("/tmp") / marker),
                    *common,
                    *_ports(),
                ],
                env=env,
                stdout=open(tmp_path / "head.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                assert time.time() < deadline, (tmp_path / "head.log").read_text()[-2000:]
                time.sleep(0.2)
        procs.append(
            subprocess.Popen(
                [ray, "start", "--address", f"127.0.0.1:{port}", *common, *_ports()],
                env=env,
                stdout=open(tmp_path / "worker.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        probe = (
            "import ray, time, sys\nray.init(address=sys.argv[1])\n"
            "for _ in range(120):\n"
            "    if sum(n['Alive'] for n in ray.nodes()) == 2: break\n"
            "    time.sleep(0.5)\n"
            "print(sum(n['Alive'] for n in ray.nodes()))\n"
        )
        got = subprocess.run(
            [sys.executable, "-c", probe, f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.stdout.strip().endswith("2"), got.stdout + got.stderr
        yield f"127.0.0.1:{port}", marker
    finally:
        # `ray start --block` stops the node's processes on SIGTERM
        stop_process_groups(procs, timeout=30)
        deadline = time.time() + 20
        while procs_with(marker) and time.time() < deadline:
            time.sleep(0.5)
        left = procs_with(marker)
        for pid in left:  # never leave a cluster behind, even when the test failed
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(Path("/tmp") / marker, ignore_errors=True)
        assert not left, f"cluster processes left after SIGTERM: {left}"


@pytest.mark.slow
def test_simulation_joins_a_two_node_cluster(tmp_path, two_node_cluster):
    address, marker = two_node_cluster
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "fedrcl_flwr.cli",
        "run",
        str(ROOT / "experiments" / "quickstart.yaml"),
        "--out",
        str(out),
    ]
    for s in [
        "dataset.synthetic.num_train=1200",
        "dataset.synthetic.num_test=300",
        "dataset.synthetic.image_size=16",
        "federation.num_clients=8",
        "federation.clients_per_round=4",
        "federation.participation=null",
        "federation.rounds=2",
        "client.local_epochs=1",
        "output.checkpoint_every=0",
        "simulation.num_cpus=1",
        f"simulation.ray_address={address}",
    ]:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2]
    nodes = {}
    for r in recs:
        for node, n in r["client_nodes"].items():
            nodes[node] = nodes.get(node, 0) + n
    assert len(nodes) == 2, nodes  # clients ran on both Ray nodes
    assert sum(nodes.values()) == 8
    # the run's own processes are gone; the cluster is still up until the fixture stops it
    assert not leftover_procs()
    assert procs_with(marker)


def test_unreachable_ray_address_is_an_input_error(tmp_path):
    port = free_port()  # nothing listens there
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedrcl_flwr.cli",
            "run",
            str(ROOT / "experiments" / "quickstart.yaml"),
            "--out",
            str(tmp_path / "o"),
            "--set",
            f"simulation.ray_address=127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "simulation.ray_address" in lines[0] and "quickstart.yaml" in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad", ["localhost", "host:", ":6379", "h:99999", "h:6379 x", 3, "auto"])
def test_malformed_ray_address_names_the_key(bad):
    from fedrcl_flwr.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="simulation.ray_address"):
        config_from_dict({"simulation": {"ray_address": bad}}, "exp.yaml")
    assert config_from_dict({"simulation": {"ray_address": "h:6379"}}).simulation.ray_address


def test_cluster_resources_are_not_this_machines(tiny, monkeypatch):
    """With a cluster, per-client CPUs are not capped by this machine's cores, and the
    private-Ray caps are refused."""
    from fedrcl_flwr.config import ConfigError
    from fedrcl_flwr.launch import preflight

    monkeypatch.setattr(preflight, "check_ray_address", lambda address: None)  # a live head
    from fedrcl_flwr.launch.preflight import check_resources
    from fedrcl_flwr.runner import federation_config

    cfg = tiny(simulation={"ray_address": "head:6379", "num_cpus": 64})
    check_resources(cfg)  # 64 CPUs per client: fine on a big cluster
    assert "init-args" not in federation_config(cfg)
    with pytest.raises(ConfigError, match="init_num_cpus"):
        check_resources(tiny(simulation={"ray_address": "head:6379", "init_num_cpus": 2}))
