"""Flower Deployment Engine on loopback: a SuperLink and two SuperNodes (real processes,
real wire): FedCCL's signals over the wire, and (the ``slow`` tier) TLS with SuperNode
authentication, SecAgg+ and a hanging device. Every process is torn down, even on
failure. Marked ``flwr`` (each round starts fresh ClientApp processes)."""

import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import stop_process_groups

from fedrcl_flwr.launch.superlink import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.flwr


def _wait_health(port, proc, timeout=60, ca=None):
    url = f"{'https' if ca else 'http'}://127.0.0.1:{port}/health"
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"process exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"no health on port {port}")


def _write_tls_material(d: Path) -> None:
    """What the openssl / ssh-keygen commands of docs/deployment.md produce: a CA, a server certificate
    for 127.0.0.1 signed by it, and one NIST P-384 key pair per SuperNode (OpenSSH private
    key, SSH public key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (d / "ca.crt").write_bytes(ca.public_bytes(pem))
    (d / "server.pem").write_bytes(cert.public_bytes(pem))
    (d / "server.key").write_bytes(
        key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    for i in range(2):
        node = ec.generate_private_key(ec.SECP384R1())
        (d / f"node{i}").write_bytes(
            node.private_bytes(
                pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        (d / f"node{i}.pub").write_bytes(
            node.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        )


@pytest.fixture
def loopback(tmp_path, request):
    """A SuperLink and two SuperNodes on loopback. ``@pytest.mark.parametrize("loopback",
    ["secure"], indirect=True)`` runs them with TLS and SuperNode authentication, started
    with the commands of docs/deployment.md."""
    secure = getattr(request, "param", "insecure") == "secure"
    home = Path(tempfile.mkdtemp(prefix="fedrcl-deploy-home-"))
    env = dict(os.environ, FLWR_HOME=str(home), PYTHONWARNINGS="ignore")
    link_port = free_port()
    procs = []
    logs = []

    def start(args, name):
        log = open(tmp_path / f"{name}.log", "wb")
        logs.append(log)
        p = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=str(home),
        )
        procs.append(p)
        return p

    # node 0 trains the partition the server assigns (0 or 1); node 1 is a real device: its
    # own data file and its own id (7, which the server never assigns)
    rng = np.random.default_rng(0)
    npz = tmp_path / "device1.npz"
    np.savez(
        npz,
        x_train=rng.integers(0, 255, (60, 16, 16, 3), dtype=np.uint8),
        y_train=rng.integers(0, 4, 60),
        x_test=rng.integers(0, 255, (20, 16, 16, 3), dtype=np.uint8),
        y_test=rng.integers(0, 4, 20),
    )
    tls = tmp_path / "tls"
    if secure:
        tls.mkdir()
        _write_tls_material(tls)
        link_sec = [
            "--ssl-ca-certfile",
            str(tls / "ca.crt"),
            "--ssl-certfile",
            str(tls / "server.pem"),
            "--ssl-keyfile",
            str(tls / "server.key"),
            "--enable-supernode-auth",
        ]
        conn = f'root-certificates = "{tls / "ca.crt"}"\n'
    else:
        link_sec, conn = ["--insecure"], "insecure = true\n"
    try:
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{link_port}"\n{conn}'
        )
        link = start(
            [
                str(BIN / "flower-superlink"),
                *link_sec,
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--disable-runtime-dependency-installation",
            ],
            "superlink",
        )
        _wait_health(link_port, link, ca=tls / "ca.crt" if secure else None)
        for i, node_cfg in enumerate(
            [
                "partition-id=0 num-partitions=2",
                f'partition-id=7 num-partitions=2 data-path="{npz}"',
            ]
        ):
            if secure:
                reg = _flwr(
                    env,
                    home,
                    "supernode",
                    "register",
                    str(tls / f"node{i}.pub"),
                    "loopback",
                    timeout=60,
                )
                assert reg.returncode == 0, reg.stdout + reg.stderr
                node_sec = [
                    "--root-certificates",
                    str(tls / "ca.crt"),
                    "--auth-supernode-private-key",
                    str(tls / f"node{i}"),
                ]
            else:
                node_sec = ["--insecure"]
            start(
                [
                    str(BIN / "flower-supernode"),
                    *node_sec,
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_cfg,
                ],
                f"supernode{i}",
            )
        yield home, env, tmp_path
    finally:
        stop_process_groups(procs, timeout=15)
        for log in logs:
            log.close()
        alive = [p.pid for p in procs if p.poll() is None]
        assert not alive, f"processes still alive: {alive}"


def _flwr(env, home, *args, timeout=300):
    return subprocess.run(
        [str(BIN / "flwr"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(home),
    )


def _run(loopback, method, rounds=2, params="{}", federation="", extra=""):
    home, env, tmp = loopback
    out = tmp / f"out_{method}"
    exp = tmp / f"{method}.yaml"
    exp.write_text(f"""
name: deploy-{method}
dataset: {{name: synthetic, synthetic: {{num_train: 400, num_test: 100, num_classes: 4,
           image_size: 16, subclusters: 2}}}}
partition: {{scheme: iid}}
model: {{name: cnn5, num_classes: 4}}
federation: {{num_clients: 2, clients_per_round: 2, participation: null, rounds: {rounds}
             {federation}}}
client: {{method: {method}, params: {params}, lr: 0.05, local_epochs: 1, batch_size: 32,
         device: cpu}}
{extra}
""")
    rc = f'experiment="{exp}" output-dir="{out}" expected-nodes=2'
    res = _flwr(env, home, "run", str(ROOT), "loopback", "--run-config", rc, "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    run_id = json.loads(res.stdout)["run-id"]
    deadline = time.time() + 400
    status = ""
    while time.time() < deadline:
        st = _flwr(env, home, "list", "loopback", "--run-id", str(run_id), "--format", "json")
        runs = json.loads(st.stdout).get("runs", [])
        status = runs[0]["status"] if runs else ""
        if status.startswith("finished"):
            break
        time.sleep(2)
    logs = _flwr(env, home, "log", str(run_id), "loopback", "--show")
    (tmp / f"serverapp_{method}.log").write_text(logs.stdout + logs.stderr)
    assert status == "finished:completed", status + logs.stdout[-3000:]
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == list(range(1, rounds + 1))
    return recs


def test_fedccl_signals_travel_between_supernodes(loopback):
    """The Deployment Engine's wiring on loopback (no TLS; TLS, SuperNode authentication,
    SecAgg+ and a hanging device: the test below): FedCCL's signals travel over the wire:
    round 1 uploads them, round 2's clients receive and use them; both nodes train, one a
    partition the server assigns, the other its own data file."""
    recs = _run(loopback, "fedccl")
    assert all(r["num_clients"] == 2 and r["failures"] == 0 for r in recs), recs
    assert recs[0]["signals_accepted"] == 2
    assert recs[1]["signal_bytes_down"] > 0
    assert "train_loss_local" in recs[1] and "train_loss_global" in recs[1]
    assert all(np.isfinite(r["test_accuracy"]) for r in recs)


@pytest.mark.slow
@pytest.mark.parametrize("loopback", ["secure"], indirect=True)
def test_over_tls_with_node_auth(loopback):
    """One TLS deployment with SuperNode authentication (both nodes registered with ``flwr
    supernode register``), three runs on it (one SuperLink start for all: the suite's time):

    1. FedCCL's signals travel over the wire: round 1 uploads them, round 2's clients
       receive and use them.
    2. ``privacy.secagg``: the ServerApp runs Flower's SecAgg+ workflow, each SuperNode's
       ClientApp secaggplus_mod (four messages a round); the round aggregates both nodes (one
       trains a server-assigned partition, the other its own data) and the model is
       evaluated.
    3. The device with id 7 hangs in fit far longer than ``federation.round_timeout_s``:
       the round goes on with the other node's update, counts the failure, and the run
       completes. (The time-out leaves room for a cold ClientApp start: torch import, data.)
    """
    recs = _run(loopback, "fedccl")
    assert all(r["num_clients"] == 2 and r["failures"] == 0 for r in recs), recs
    assert recs[0]["signals_accepted"] == 2
    assert recs[1]["signal_bytes_down"] > 0
    assert "train_loss_local" in recs[1] and "train_loss_global" in recs[1]

    recs = _run(loopback, "fedavg", rounds=1, extra="privacy: {secagg: true}")
    log = (loopback[2] / "serverapp_fedavg.log").read_text()
    assert "privacy.secagg: Flower's SecAggPlusWorkflow" in log, log[-2000:]
    assert all(r["num_clients"] == 2 and r["failures"] == 0 for r in recs), recs
    assert all(np.isfinite(r["test_accuracy"]) and np.isfinite(r["train_loss"]) for r in recs)

    t0 = time.time()
    recs = _run(
        loopback,
        "faulty",
        params="{mode: sleep, partitions: [7], sleep_s: 600}",
        rounds=1,
        federation=", round_timeout_s: 30",
    )
    assert all(r["num_clients"] == 1 and r["failures"] == 1 for r in recs), recs
    assert all(np.isfinite(r["test_accuracy"]) for r in recs)
    assert time.time() - t0 < 240  # did not wait for the sleeper
