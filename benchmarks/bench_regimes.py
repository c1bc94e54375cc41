"""Cost of a run against the cost of its training, in three regimes.

For each regime, the same experiment runs twice, each as a whole fresh process with the
dataset cache warm: ``fedrcl-flwr run`` (Flower's runtime: SuperLink, Ray, one one-thread
actor per core) and the project's sequential in-process runner
(:func:`fedrcl_flwr.app.inprocess.run_inprocess`: the same strategy and clients, no
Flower runtime, torch's default threads: the "bare loop" a user would write).

* ``quickstart``: ``experiments/quickstart.yaml`` (5 of 100 clients per round, cnn5);
* ``big``: ResNet-18-GN (11.2 M parameters), 5 clients per round x 1 local step, 8x8
  images: what remains is moving a real backbone's weights;
* ``xdev``: cross-device, 1,000 clients, 50 per round, 50 samples each, one epoch of
  batch 10 (5 steps): what remains is the per-client cost of a message.

A run's *steady* round is the mean interval between the ``wall_time_s`` of its records
from round 3 on (round 2 on for runs of 3-4 rounds): round 1 pays Ray's actor start.
Its *start-up* is process start to round 1's start. One line per (regime, rounds,
transport) ends in ``steady sim/bare = X.XX``; the quickstart's lines also give the
whole-run ratio. ``--transport shared|flower|both`` (default both): the Flower run's
``simulation.transport`` (weights by reference to the run's store, or inside
Flower's messages); both are compared with the same in-process run (its weights through
the codec, as before). A summary table ends the output.

The Flower run is timed in its real path (``FEDRCL_TIMERS``, :mod:`fedrcl_flwr.run.timers`):
the table below each regime splits an actor's time per client message into Ray
dispatch, message decode, client construction, model load, training and encode, plus
the per-round SuperLink round trip and the server's time between rounds, amortised over
the round's clients. ``--floor`` measures Flower's own minimal simulation (a no-op
ServerApp + ClientApp, the same number of SuperNodes and messages per round, Flower's own
``flwr run``) and reports the run's start-up as "Flower's floor + X s".

Under each run's line, its CPU seconds by kind of process (:data:`PROCESS_KINDS`: Ray's
workers, the simulation process, Ray's node, the SuperLink, the SuperExec, the CLI, the
watchdog; or the in-process runner), sampled every 0.5 s: on a small machine a whole run's
start-up is CPU-bound, and this says whose CPU it is.

Every figure is printed with the machine's load: the 1-minute load average before the
run and the CPU that processes other than the benchmark's used during it. A goal is
called met only when that CPU stayed under ``--quiet-cores`` (0.10 cores); otherwise the
verdict is "not judged (busy machine)".

    python benchmarks/bench_regimes.py --regime all --rounds 10 --floor
    python benchmarks/bench_regimes.py --regime big --rounds 6 --repeat 3 --transport both
    python benchmarks/bench_regimes.py --regime quickstart --rounds 20 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median

from _common import ROOT

from fedrcl_flwr.run import timers
from fedrcl_flwr.run.results import read_metrics


@dataclass
class Regime:
    name: str
    sets: list[str]
    rounds: list[int]  # default --rounds
    steady_goal: float | None = None
    whole_goals: dict = field(default_factory=dict)  # rounds -> whole-run ratio goal
    overhead_goal_ms: float | None = None  # per-client overhead (all but training)


REGIMES = {
    "quickstart": Regime("quickstart", [], [20, 5], whole_goals={20: 1.10, 5: 1.5}),
    "big": Regime(
        "big",
        [
            "model.name=resnet18_gn",
            "dataset.synthetic.image_size=8",
            "dataset.synthetic.num_test=200",
            "client.local_epochs=1",
            "client.iterations_per_epoch=1",
        ],
        [10],
        steady_goal=1.10,
    ),
    "xdev": Regime(
        "xdev",
        [
            "federation.num_clients=1000",
            "federation.participation=0.05",
            "dataset.synthetic.num_train=50000",
            "client.batch_size=10",
            "client.local_epochs=1",
        ],
        [10],
        steady_goal=0.80,
        overhead_goal_ms=15.0,
    ),
}

INPROCESS = """
import sys
from pathlib import Path
try:
    from fedrcl_flwr.launch.preflight import load_experiment
except ImportError:  # a checkout (--code) from before the pre-run checks had their module
    from fedrcl_flwr.cli import _load as load_experiment
from fedrcl_flwr.app.inprocess import run_inprocess
cfg = load_experiment(sys.argv[1], sys.argv[3:], sys.argv[2])
run_inprocess(cfg, Path(cfg.output_dir()))
"""


# ------------------------------------------------------------------ the machine's load


def _busy_ticks() -> int:
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)


def _proc_ticks(pid: str) -> tuple[int, int]:
    """(utime + stime, start time) of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12]), int(rest[19])


# what each process of a run is, by its command line (the first match), for the CPU
# accounting of a run (``cpu_line``): the start-up of a whole run on a small machine is
# CPU-bound, so CPU seconds say where it goes better than a timeline does
PROCESS_KINDS = [
    ("default_worker.py", "Ray workers (actors)"),
    ("flwr-simulation", "simulation process"),
    ("flower-superlink", "SuperLink"),
    ("flower-superexec", "SuperExec"),
    ("gcs_server", "Ray's node"),
    ("raylet", "Ray's node"),
    ("dashboard", "Ray's node"),
    ("runtime_env", "Ray's node"),
    ("log_monitor", "Ray's node"),
    ("monitor.py", "Ray's node"),
    ("fedrcl_flwr.launch.processes", "watchdog"),
    ("run_inprocess", "in-process runner"),  # before the CLI: its code names the CLI module
    ("fedrcl_flwr.cli", "CLI"),
]


def process_kind(pid: str) -> str:
    if pid == str(os.getpid()):
        return "benchmark"
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return "other"
    return kind_of_command(cmd)


def kind_of_command(cmd: str) -> str:
    """What a process of a run is (:data:`PROCESS_KINDS`), from its command line."""
    return next((kind for needle, kind in PROCESS_KINDS if needle in cmd), "other")


def cpu_line(r: dict) -> str:
    """CPU seconds of a run's processes by kind (sampled every 0.5 s: a process's last
    half second before it ends, and any process shorter than that, are missed)."""
    cpu = r.get("cpu") or {}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
    return (
        f"  {'':<17} CPU {sum(cpu.values()):5.1f} s over {r['wall']:.1f} s: {parts}" if cpu else ""
    )


class LoadWatch:
    """CPU used by processes other than the benchmark's while a measurement runs:
    total busy CPU (``/proc/stat``) less the CPU of the benchmark's processes (itself and
    every process whose environment, command line or working directory names its private
    ``TMPDIR``: the run's SuperLink, simulation process, Ray), sampled every 0.5 s."""

    def __init__(self, marker: str):
        self.marker = marker
        self.ours: dict[tuple[str, int], bool] = {}  # (pid, start time) -> ours?
        self.kind: dict[tuple[str, int], str] = {}  # ... -> what it is (PROCESS_KINDS)
        self.kind_ticks: dict[str, int] = {}
        self.last: dict[tuple[str, int], int] = {}  # ... -> CPU ticks at the last sample
        self.ours_ticks = 0
        self._started = False

    def _is_ours(self, pid: str) -> bool:
        if pid == str(os.getpid()):
            return True
        needle = self.marker.encode()
        try:
            return (
                needle in Path(f"/proc/{pid}/environ").read_bytes()
                or needle in Path(f"/proc/{pid}/cmdline").read_bytes()
                or self.marker in os.readlink(f"/proc/{pid}/cwd")
            )
        except OSError:
            return False

    def _sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                ticks, start = _proc_ticks(entry.name)
            except (OSError, IndexError, ValueError):
                continue
            key = (entry.name, start)
            if key not in self.ours:
                self.ours[key] = self._is_ours(entry.name)
                if self.ours[key]:
                    self.kind[key] = process_kind(entry.name)
                # a process of ours born during the watch counts with all of its CPU
                self.last[key] = 0 if self._started else ticks
            if self.ours[key]:
                self.ours_ticks += ticks - self.last[key]
                kind = self.kind[key]
                self.kind_ticks[kind] = self.kind_ticks.get(kind, 0) + ticks - self.last[key]
                self.last[key] = ticks

    def __enter__(self):
        self.load_before = os.getloadavg()[0]
        self._sample()
        self._started = True
        self.ours_ticks = 0
        self.kind_ticks = {}
        self.t0, self.busy0 = time.time(), _busy_ticks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        wall = max(time.time() - self.t0, 1e-9)
        hz = os.sysconf("SC_CLK_TCK")
        others = (_busy_ticks() - self.busy0 - self.ours_ticks) / hz
        self.others_cores = max(others, 0.0) / wall
        self.cpu_by_kind = {
            k: t / hz for k, t in self.kind_ticks.items() if k != "benchmark" and t > 0
        }
        return False

    def describe(self) -> str:
        return f"load {self.load_before:.2f} before, others {self.others_cores:.2f} cores"


# ---------------------------------------------------------------------- measurements

CODE = ROOT  # the checkout whose runners are measured (--code)


def timed_process(cmd: list[str], env: dict, watch: LoadWatch) -> dict:
    """Run ``cmd`` to its end; wall seconds, the arrival time (seconds after start) of
    each printed round line with the round's own ``round_time_s``, the exit code."""
    with watch:
        t_launch = time.time()
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=CODE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        rounds, tail = [], []
        for line in proc.stdout:
            now = time.perf_counter() - t0
            tail = (tail + [line])[-40:]
            text = line.strip()
            if text.startswith("round ") and "|" in text:
                # the round time is the last "| N.NNs" field (an "| ETA ..." may follow it)
                fields = [f.strip() for f in text.split("|")[1:] if not f.strip().startswith("ETA")]
                if fields and fields[-1].endswith("s"):
                    rounds.append((now, float(fields[-1].rstrip("s"))))
        proc.wait()
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print("".join(tail), file=sys.stderr)
    out = {
        "rc": proc.returncode,
        "wall": wall,
        "rounds": rounds,
        "t_launch": t_launch,
        "load": watch.describe(),
        "others": watch.others_cores,
        "cpu": watch.cpu_by_kind,
    }
    if rounds:
        out["startup"] = rounds[0][0] - rounds[0][1]
    return out


def steady_round(out_dir: Path) -> float:
    """Mean interval between the records' ``wall_time_s`` from round 3 (round 2 for runs
    of 3-4 rounds; the one round's time for shorter runs)."""
    recs = [r for r in read_metrics(out_dir) if "wall_time_s" in r]
    if len(recs) < 2:
        return float(recs[0]["round_time_s"]) if recs else float("nan")
    first = 2 if len(recs) >= 5 else 1
    a, b = recs[first - 1], recs[-1]
    return (float(b["wall_time_s"]) - float(a["wall_time_s"])) / (b["round"] - a["round"])


def measure_bare(
    regime: Regime, rounds: int, exp: Path, env: dict, work: Path, marker: str, extra: list[str]
) -> dict:
    """The in-process runner (its weights through the codec, as with
    ``simulation.transport=flower``; the baseline does not move with the transport)."""
    sets = [f"federation.rounds={rounds}", "output.checkpoint_every=0", *regime.sets, *extra]
    out_a = work / f"{regime.name}-{rounds}-bare"
    shutil.rmtree(out_a, ignore_errors=True)
    bare = timed_process(
        [
            sys.executable,
            "-c",
            INPROCESS,
            str(exp),
            str(out_a),
            *sets,
            "simulation.transport=flower",
        ],
        env,
        LoadWatch(marker),
    )
    bare["steady"] = steady_round(out_a)
    return bare


def measure_sim(
    regime: Regime,
    rounds: int,
    exp: Path,
    env: dict,
    work: Path,
    marker: str,
    extra: list[str],
    transport: str,
) -> tuple[dict, Path]:
    """``fedrcl-flwr run`` with ``simulation.transport=transport`` (its stage timers on)."""
    sets = [
        f"federation.rounds={rounds}",
        "output.checkpoint_every=0",
        *regime.sets,
        *extra,
        f"simulation.transport={transport}",
    ]
    out_b = work / f"{regime.name}-{rounds}-sim-{transport}"
    timer_dir = work / f"{regime.name}-{rounds}-timers-{transport}"
    for d in (out_b, timer_dir):
        shutil.rmtree(d, ignore_errors=True)
    timer_dir.mkdir(parents=True)
    cli = [sys.executable, "-m", "fedrcl_flwr.cli", "run", str(exp), "--out", str(out_b)]
    for s in sets:
        cli += ["--set", s]
    sim = timed_process(cli, {**env, timers.ENV_VAR: str(timer_dir)}, LoadWatch(marker))
    sim["steady"] = steady_round(out_b)
    _, server = timers.read_records(timer_dir)
    sim["marks"] = startup_marks(server, sim["t_launch"])
    if "round1" in sim["marks"]:  # precise: the ServerApp's own clock at round 1's start
        sim["startup"] = sim["marks"]["round1"] - sim["t_launch"]
    return sim, timer_dir


# the start-up, process launch to round 1, in segments: (label, from mark, to mark)
STARTUP_SEGMENTS = [
    ("CLI imports and pre-run checks (before any Flower process)", "launch", "superlink"),
    ("SuperLink launch -> simulation process starts", "superlink", "process"),
    ("process start -> ServerApp module imported", "process", "imported"),
    ("module imported -> ServerApp called", "imported", "called"),
    ("ServerApp set-up (data, model, strategy)", "called", "built"),
    ("set-up done -> round 1 starts", "built", "round1"),
]


def startup_marks(server: list[dict], t_launch: float) -> dict:
    """The wall-clock marks of STARTUP_SEGMENTS from a run's timer events
    (:mod:`fedrcl_flwr.run.timers`; the first of each, so a resumed run's later
    events do not count); a mark whose event is missing is left out."""
    marks = {"launch": t_launch}
    firsts: dict[str, dict] = {}
    for e in server:
        if e["event"] == "configure" and e.get("round") != 1:
            continue
        firsts.setdefault(e["event"], e)
    if "superlink_launch" in firsts:
        marks["superlink"] = firsts["superlink_launch"]["t"]
    if "serverapp_start" in firsts:
        e = firsts["serverapp_start"]
        marks.update(process=e["process_start"], imported=e["imported"], called=e["t"])
    if "serverapp_built" in firsts:
        marks["built"] = firsts["serverapp_built"]["t"]
    if "configure" in firsts:
        marks["round1"] = firsts["configure"]["t"]
    return marks


def print_startup(ours: dict, floor: dict) -> None:
    """Ours against Flower's floor, segment by segment (seconds)."""
    print(f"  start-up in segments, s: {'ours':>6s} {'floor':>6s} {'extra':>6s}")

    def seg(marks: dict, a: str, b: str) -> float:
        return marks[b] - marks[a] if a in marks and b in marks else float("nan")

    for label, a, b in STARTUP_SEGMENTS:
        x, f = seg(ours, a, b), seg(floor, a, b)
        print(f"    {label:<60} {x:6.2f} {f:6.2f} {x - f:+6.2f}")
    x, f = seg(ours, "launch", "round1"), seg(floor, "launch", "round1")
    print(f"    {'total':<60} {x:6.2f} {f:6.2f} {x - f:+6.2f}")


# ------------------------------------------------------------------------ breakdown

STAGES = [
    ("Ray dispatch (gap between an actor's messages)", "dispatch"),
    ("message decode (Flower, + mods)", "decode"),
    ("client construction (client_fn)", "construct"),
    ("data lookup (partition indices)", "data"),
    ("model load (pooled model + global weights)", "load"),
    ("training (train_local)", "train"),
    ("rest of fit (seeding, batches, metrics)", "fit_rest"),
    ("upload (weights out: store or encoding, Flower's reply)", "encode"),
]


def breakdown(timer_dir: Path, first_round: int) -> dict | None:
    """Per-client means (seconds) of every stage over rounds >= ``first_round``, and
    the per-round SuperLink round trip and server time between rounds."""
    clients, server = timers.read_records(timer_dir)
    clients = [c for c in clients if "round" in c and "t_fit_end" in c]
    if not clients:
        return None
    by_actor: dict[int, list[dict]] = {}
    for c in sorted(clients, key=lambda c: c["t_enter"]):
        by_actor.setdefault(c["pid"], []).append(c)
    for recs in by_actor.values():
        for prev, cur in zip(recs, recs[1:]):
            if prev["round"] == cur["round"]:
                cur["dispatch"] = cur["t_enter"] - prev["t_exit"]
    steady = [c for c in clients if c["round"] >= first_round]
    rows = {}
    for c in steady:
        st = c["stages"]
        construct = st.get("construct", 0.0)
        fit = c["t_fit_end"] - c["t_fit"]
        vals = {
            "decode": c["t_fit"] - c["t_enter"] - construct,
            "construct": construct,
            "data": st.get("data", 0.0),
            "load": st.get("load", 0.0),
            "train": st.get("train", 0.0),
            # from the end of training to the ClientApp's return: the upload's write
            # (the "encode" stage, WireClient) and Flower's reply message
            "encode": c["t_exit"] - c["t_fit_end"],
        }
        vals["fit_rest"] = fit - sum(st.get(k, 0.0) for k in ("data", "load", "train"))
        for k, v in vals.items():
            rows.setdefault(k, []).append(v)
    gaps = [c["dispatch"] for c in steady if "dispatch" in c]
    out = {k: mean(v) for k, v in rows.items()}
    out["dispatch"] = mean(gaps) if gaps else float("nan")
    events: dict[tuple[str, int], float] = {}
    for e in server:
        if "round" in e:  # round events (start-up events have none)
            events.setdefault((e["event"], e["round"]), e["t"])
    rounds = sorted({c["round"] for c in steady})
    link_in, link_out, between = [], [], []
    for r in rounds:
        mine = [c for c in steady if c["round"] == r]
        if ("sent", r) in events:
            link_in.append(min(c["t_enter"] for c in mine) - events[("sent", r)])
        if ("results", r) in events:
            link_out.append(events[("results", r)] - max(c["t_exit"] for c in mine))
            if ("sent", r + 1) in events:
                between.append(events[("sent", r + 1)] - events[("results", r)])
    out["link_in"] = mean(link_in) if link_in else float("nan")
    out["link_out"] = mean(link_out) if link_out else float("nan")
    out["between"] = mean(between) if between else float("nan")
    out["actors"] = len(by_actor)
    out["per_round"] = len(steady) / max(len(rounds), 1)
    out["rounds"] = len(rounds)
    return out


def print_breakdown(b: dict, steady_s: float) -> float:
    """Print the table; return the per-client overhead (everything but training, ms)."""
    actors, k = b["actors"], b["per_round"]
    share = actors / k  # a per-round latency idles every actor: its actor-time per client
    print(
        f"  per client message ({b['rounds']} steady rounds, {k:.0f} clients per round, "
        f"{actors} actors), ms of actor time:"
    )
    total = 0.0
    for label, key in STAGES:
        v = b.get(key, float("nan")) * 1000
        print(f"    {label:<52} {v:8.2f}")
        if key != "train" and v == v:
            total += v
    per_round = [
        ("SuperLink round trip in (sent -> first ClientApp)", "link_in"),
        ("SuperLink round trip out (last reply -> results)", "link_out"),
        ("server between rounds (aggregate, round end, configure)", "between"),
    ]
    for label, key in per_round:
        v = b[key] * 1000
        amort = v * share
        print(f"    {label:<52} {amort:8.2f}  ({v:.0f} ms per round x {actors}/{k:.0f})")
        if amort == amort:
            total += amort
    train = b["train"] * 1000
    busy = (total + train) * k / actors / 1000
    print(f"    {'per-client overhead (everything but training)':<52} {total:8.2f}")
    print(
        f"    accounted: {busy:.2f} s of actor time per actor and round vs steady round "
        f"{steady_s:.2f} s"
    )
    return total


# ----------------------------------------------------------------------------- floor

FLOOR_APP = '''
import json
import os
import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

IMPORTED_AT = time.time()


def process_start_time():
    """This process's start (as fedrcl_flwr.run.timers.process_start_time)."""
    with open("/proc/self/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))

client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    """No work: the reply carries back what the message carried (a model's bytes)."""
    content = RecordDict({"res": ConfigRecord({"ok": 1})})
    for name, record in msg.content.array_records.items():
        content[name] = record
    return Message(content, reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    started = {"main_start": time.time(), "process_start": process_start_time(),
               "imported": IMPORTED_AT}
    out, k = str(context.run_config["out"]), int(context.run_config["per-round"])
    payload = int(context.run_config["payload-bytes"])

    def note(**rec):
        with open(out, "a") as fh:
            fh.write(json.dumps(rec) + "\\n")

    for r in range(1, int(context.run_config["rounds"]) + 1):
        t = time.time()
        nodes = sorted(grid.get_node_ids())
        while len(nodes) < k:
            time.sleep(0.05)
            nodes = sorted(grid.get_node_ids())
        content = {"ins": ConfigRecord({"round": r})}
        if payload:
            content["weights"] = ArrayRecord([np.zeros(payload // 4, np.float32)])
        msgs = [Message(RecordDict(content), dst_node_id=n, message_type="train")
                for n in nodes[:k]]
        replies = list(grid.send_and_receive(msgs))
        note(round=r, start=t, end=time.time(), replies=len(replies),
             errors=sum(m.has_error() for m in replies), **(started if r == 1 else {}))
'''

FLOOR_TOML = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "flowerfloor"
version = "1.0.0"
dependencies = ["flwr"]

[tool.flwr.app]
publisher = "bench"

[tool.flwr.app.components]
serverapp = "floor_app:server"
clientapp = "floor_app:client"

[tool.flwr.app.config]
out = ""
per-round = 1
rounds = 3
payload-bytes = 0
"""


def measure_floor(
    nodes: int, per_round: int, rounds: int, payload: int, env: dict, work: Path, marker: str
) -> dict:
    """Flower's minimal simulation as a Flower user runs it: ``flower-superlink
    --simulation`` (the runner's flags and environment) and ``flwr run`` of a no-op app
    with ``nodes`` SuperNodes (one CPU per client) whose messages carry ``payload`` bytes
    there and back (the model's size: Flower's own cost of moving it); times from the
    SuperLink's launch."""
    from fedrcl_flwr.launch.processes import RUN_VAR, teardown
    from fedrcl_flwr.launch.superlink import free_port

    app = work / "floor-app"
    app.mkdir(parents=True, exist_ok=True)
    (app / "floor_app.py").write_text(FLOOR_APP)
    (app / "pyproject.toml").write_text(FLOOR_TOML)
    home = Path(tempfile.mkdtemp(prefix="fedrcl-flwr-home-"))
    port = free_port()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n'
        f'[superlink.local]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    out = work / "floor.jsonl"
    out.unlink(missing_ok=True)
    fenv = {
        **env,
        "FLWR_HOME": str(home),
        RUN_VAR: str(home),  # its processes are the run's: teardown stops them
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
        "RAY_prestart_worker_first_driver": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        "PYTHONWARNINGS": "ignore",
    }
    fenv.pop("RAY_ADDRESS", None)
    bindir = Path(sys.executable).parent
    exe = lambda name: str(bindir / name) if (bindir / name).exists() else shutil.which(name)  # noqa: E731 - one-line lookup
    watch = LoadWatch(marker)
    link = None
    recs: list[dict] = []
    with watch:
        t_launch = time.time()
        try:
            link = subprocess.Popen(
                [
                    exe("flower-superlink"),
                    "--simulation",
                    "--insecure",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--disable-runtime-dependency-installation",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=fenv,
                start_new_session=True,
                cwd=str(home),
            )
            fed = (
                f"num-supernodes={nodes} client-resources-num-cpus=1 client-resources-num-gpus=0.0"
            )
            cfg = f'out="{out}" per-round={per_round} rounds={rounds} payload-bytes={payload}'
            deadline = time.time() + 300
            while True:  # flwr run fails until the SuperLink answers
                sub = subprocess.run(
                    [
                        exe("flwr"),
                        "run",
                        str(app),
                        "local",
                        "--federation-config",
                        fed,
                        "--run-config",
                        cfg,
                    ],
                    env=fenv,
                    capture_output=True,
                    text=True,
                )
                if sub.returncode == 0 and "Successfully started run" in sub.stdout:
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"flwr run failed: {sub.stdout[-500:]} {sub.stderr[-500:]}")
                time.sleep(0.1)
            while time.time() < deadline:
                if out.exists():
                    recs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
                    if len(recs) >= rounds:
                        break
                time.sleep(0.05)
        finally:
            teardown(home, [link.pid] if link is not None else [])
    if len(recs) < rounds:
        return {"ok": False, "load": watch.describe(), "others": watch.others_cores}
    steady = [r["end"] - r["start"] for r in recs[2:]]
    first = recs[0]
    return {
        "ok": True,
        "marks": {  # the floor's start-up in the segments of STARTUP_SEGMENTS
            "launch": t_launch,
            "superlink": t_launch,
            "process": first["process_start"],
            "imported": first["imported"],
            "called": first["main_start"],
            "built": first["main_start"],
            "round1": first["start"],
        },
        "startup": recs[0]["start"] - t_launch,
        "round1": recs[0]["end"] - recs[0]["start"],
        "noop_round": median(steady) if steady else float("nan"),
        "errors": sum(r["errors"] for r in recs),
        "load": watch.describe(),
        "others": watch.others_cores,
    }


# ------------------------------------------------------------------------------ main


def verdict(value: float, goal: float | None, quiet: bool) -> str:
    if goal is None or value != value:
        return ""
    if not quiet:
        return f" (goal <= {goal:.2f}: not judged, busy machine)"
    return f" (goal <= {goal:.2f}: {'met' if value <= goal else 'missed'})"


def describe(name: str, r: dict) -> str:
    if r["rc"] != 0 or not r["rounds"]:
        return f"  {name:<17} FAILED (exit {r['rc']})"
    return (
        f"  {name:<17} whole {r['wall']:6.1f} s = start-up {r['startup']:5.1f} s + "
        f"rounds and end {r['wall'] - r['startup']:5.1f} s; round 1 "
        f"{r['rounds'][0][1]:.2f} s; steady {r['steady']:.3f} s/round  [{r['load']}]"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--regime",
        action="append",
        default=[],
        help="quickstart, big, xdev or all (repeatable; default all)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        nargs="+",
        default=None,
        help="rounds per run (several: one measurement each); default: "
        "quickstart 20 and 5, big 10, xdev 10",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also measure Flower's minimal simulation for each regime",
    )
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "quickstart.yaml"))
    ap.add_argument(
        "--quiet-cores",
        type=float,
        default=0.10,
        help="others' CPU (cores, mean over a run) above which the machine "
        "counts as busy and no goal is judged",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override added to every regime's experiment",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure each setting this many times; the run pair with the "
        "median steady ratio is reported (of an even number, the upper middle one)",
    )
    ap.add_argument(
        "--code",
        metavar="DIR",
        help="measure the runners of another checkout (e.g. a `git worktree` "
        "of an earlier commit): its fedrcl_flwr goes first on the path of "
        "every process; figures only (its runs have no stage timers)",
    )
    ap.add_argument("--keep", metavar="DIR", help="keep the runs' directories here")
    ap.add_argument(
        "--transport",
        choices=["shared", "flower", "both"],
        default="both",
        help="simulation.transport of the Flower runs: weights by reference "
        "(shared), inside Flower's messages (flower) or each (both; the same in-process "
        "baseline for both)",
    )
    args = ap.parse_args()
    global CODE
    if args.code:
        CODE = Path(args.code).resolve()
        if not (CODE / "fedrcl_flwr").is_dir():
            ap.error(f"--code {CODE}: no fedrcl_flwr package there")
        if args.floor:
            ap.error(
                "--floor measures Flower's floor for this checkout's runs: leave it out with --code"
            )
    names = args.regime or ["all"]
    if "all" in names:
        names = list(REGIMES)
    bad = [n for n in names if n not in REGIMES]
    if bad:
        ap.error(f"unknown regime {bad[0]!r}: choose from {', '.join(REGIMES)} or all")
    exp = Path(args.experiment).resolve()
    work = (
        Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="bench-regimes-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    private_tmp = Path(tempfile.mkdtemp(prefix="bench-regimes-tmp-"))
    marker = str(private_tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    env.pop(timers.ENV_VAR, None)
    env["PYTHONPATH"] = str(CODE) + os.pathsep + env.get("PYTHONPATH", "")
    env["TMPDIR"] = str(private_tmp)  # every process of ours names it (LoadWatch)
    os.environ["TMPDIR"] = str(private_tmp)
    tempfile.tempdir = None
    print(
        f"machine: {os.cpu_count()} cores, 1-min load {os.getloadavg()[0]:.2f}; "
        f"in-process runner with torch's default threads; Flower: one actor per core; "
        f"code: {CODE}"
    )
    failed = False
    table: list[tuple] = []
    try:
        for name in names:
            regime = REGIMES[name]
            failed |= not run_regime(
                regime, args.rounds or regime.rounds, exp, env, work, marker, args, table
            )
    except KeyboardInterrupt:
        failed = True
    finally:
        print_table(table, args.repeat)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(private_tmp, ignore_errors=True)
    return 1 if failed else 0


def run_regime(
    regime: Regime,
    rounds_list: list[int],
    exp: Path,
    env: dict,
    work: Path,
    marker: str,
    args,
    table: list,
) -> bool:
    base = ["output.checkpoint_every=0", *regime.sets, *args.set]
    t0 = time.perf_counter()
    warm = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedrcl_flwr.cli",
            "partition",
            str(exp),
            "--max-rows",
            "0",
            *sum((["--set", s] for s in base), []),
        ],
        cwd=CODE,
        env=env,
        capture_output=True,
        text=True,
    )
    if warm.returncode != 0:
        print(warm.stdout[-2000:], warm.stderr[-2000:], file=sys.stderr)
        return False
    print(
        f"{regime.name}: dataset cache warm ({time.perf_counter() - t0:.1f} s, CLI "
        f"process incl. imports); --set {' '.join(regime.sets) or '(none)'}"
    )
    ok = True
    transports = ["shared", "flower"] if args.transport == "both" else [args.transport]
    for rounds in rounds_list:
        trials: dict = {t: [] for t in transports}
        for i in range(max(1, args.repeat)):
            bare = measure_bare(regime, rounds, exp, env, work, marker, args.set)
            for t in transports:
                sim, timer_dir = measure_sim(regime, rounds, exp, env, work, marker, args.set, t)
                kept = timer_dir.with_name(f"{timer_dir.name}-{i}")
                shutil.rmtree(kept, ignore_errors=True)
                timer_dir.rename(kept)  # the next trial writes its own
                ratio = sim["steady"] / bare["steady"] if bare.get("steady") else float("nan")
                trials[t].append((ratio, bare, sim, kept))
        for t in transports:
            ok &= report(regime, rounds, t, trials[t], env, work, marker, exp, args, table)
    return ok


def report(regime, rounds, transport, trials, env, work, marker, exp, args, table) -> bool:
    """The lines of one (regime, rounds, transport): the median trial's runs, the
    per-client breakdown, Flower's floor (``--floor``), and the line ending in
    ``steady sim/bare = X.XX``."""
    ok = True
    trials.sort(key=lambda t: (t[0] != t[0], t[0]))
    # the median trial; of an even number, the upper of the two middle ones (the worse
    # ratio: two trials never report the better one alone)
    _, bare, sim, timer_dir = trials[len(trials) // 2]
    if len(trials) > 1:
        print(
            f"  {len(trials)} trials, transport {transport}, steady sim/bare: "
            + ", ".join(f"{t[0]:.2f}" for t in trials)
            + " (median reported)"
        )
    print(describe("in-process", bare))
    print(describe(f"run ({transport})", sim))
    for r in (bare, sim):
        if r["rc"] == 0 and cpu_line(r):
            print(cpu_line(r))
    if bare["rc"] or sim["rc"] or not bare["rounds"] or not sim["rounds"]:
        table.append((regime.name, rounds, transport, None, None, None, "FAILED", trials))
        return False
    quiet = max(bare["others"], sim["others"]) < args.quiet_cores
    b = breakdown(timer_dir, first_round=3 if rounds >= 5 else 2)
    over = None
    if b is not None:
        over = print_breakdown(b, sim["steady"])
        if regime.overhead_goal_ms is not None:
            print(
                f"  per-client overhead {over:.1f} ms"
                f"{verdict(over, regime.overhead_goal_ms, quiet)}"
            )
    if args.floor:
        floor = measure_floor_for(regime, rounds, env, work, marker, exp, args.set)
        if floor.get("ok"):
            extra = sim["startup"] - floor["startup"]
            print(
                f"  Flower's floor (no-op apps, {floor['nodes']} SuperNodes, "
                f"{floor['per_round']} messages per round each carrying the model's "
                f"{floor['payload'] / 2**20:.1f} MiB there and back): start-up "
                f"{floor['startup']:.1f} s, round 1 {floor['round1']:.2f} s, no-op "
                f"round {floor['noop_round']:.3f} s  [{floor['load']}]"
            )
            print_startup(sim.get("marks", {}), floor["marks"])
            q = quiet and floor["others"] < args.quiet_cores
            print(f"  start-up = Flower's floor + {extra:.1f} s{verdict(extra, 3.0, q)}")
        else:
            print(f"  Flower's floor: FAILED [{floor.get('load', '')}]")
            ok = False
    ratio = sim["steady"] / bare["steady"]
    whole = sim["wall"] / bare["wall"]
    head = (
        f"{regime.name}, {rounds} rounds, transport {transport} "
        f"[{'quiet' if quiet else 'BUSY'} machine]: "
    )
    parts = [
        f"steady sim {sim['steady']:.3f} s vs bare {bare['steady']:.3f} s/round"
        f"{verdict(ratio, regime.steady_goal, quiet)}"
    ]
    if regime.whole_goals or rounds in regime.whole_goals:
        parts.append(
            f"whole run sim/bare = {whole:.2f}"
            f"{verdict(whole, regime.whole_goals.get(rounds), quiet)}"
        )
    print(head + "; ".join(parts) + f"; steady sim/bare = {ratio:.2f}", flush=True)
    goal = regime.steady_goal if regime.steady_goal is not None else regime.whole_goals.get(rounds)
    judged = ratio if regime.steady_goal is not None else whole
    table.append(
        (
            regime.name,
            rounds,
            transport,
            sim["steady"],
            bare["steady"],
            (ratio, whole, over),
            verdict(judged, goal, quiet).strip(" ()") or "-",
            trials,
        )
    )
    return ok


def print_table(table: list, repeat: int) -> None:
    """One row per (regime, rounds, transport): the median trial's figures."""
    if not table:
        return
    print(f"\nsummary (median of {max(1, repeat)} trial(s) each; steady = s/round from round 3):")
    print(
        f"  {'regime':<11}{'rounds':>6}  {'transport':<9}{'sim s/r':>9}{'bare s/r':>9}"
        f"{'steady':>8}{'whole':>7}{'ovh ms':>8}  trials (steady sim/bare)  goal"
    )
    for name, rounds, transport, sim_s, bare_s, ratios, goal, trials in table:
        if ratios is None:
            print(f"  {name:<11}{rounds:>6}  {transport:<9}  FAILED")
            continue
        ratio, whole, over = ratios
        ovh = f"{over:8.1f}" if over is not None else f"{'-':>8}"
        tr = ", ".join(f"{t[0]:.2f}" for t in trials)
        print(
            f"  {name:<11}{rounds:>6}  {transport:<9}{sim_s:9.3f}{bare_s:9.3f}"
            f"{ratio:8.2f}{whole:7.2f}{ovh}  {tr:<24}  {goal}"
        )


def measure_floor_for(
    regime: Regime, rounds: int, env: dict, work: Path, marker: str, exp: Path, extra: list[str]
) -> dict:
    from fedrcl_flwr.launch.preflight import load_experiment
    from fedrcl_flwr.run.runtime import get_weights, load_bundle, new_model

    cfg = load_experiment(str(exp), [f"federation.rounds={rounds}", *regime.sets, *extra], None)
    nodes, k = cfg.supernodes(), cfg.federation.sampled_per_round()
    payload = sum(a.nbytes for a in get_weights(new_model(cfg, load_bundle(cfg))))
    res = measure_floor(nodes, k, 6, payload, env, work, marker)
    res.update(nodes=nodes, per_round=k, payload=payload)
    return res


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    sys.exit(main())
