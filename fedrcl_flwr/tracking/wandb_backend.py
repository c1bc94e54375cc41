"""Weights & Biases: one W&B run per run directory, its files (and W&B's cache, config
and data directories) under ``<run dir>/wandb/``; a dropped W&B run has its service process
(``wandb-core``) stopped (:func:`stop_wandb_service`)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from fedrcl_flwr.run.run_files import WANDB_DIR
from fedrcl_flwr.tracking.backend import Backend


class WandbBackend(Backend):
    name = "wandb"

    def __init__(self, run_dir: Path, cfg, config: dict, previous: dict):
        from fedrcl_flwr.run.results import write_marker

        self.run_dir = Path(run_dir)
        self.run = None
        run_id = previous.get("id") or secrets.token_hex(6)  # W&B: [a-z0-9_-]
        if not (self.run_dir / WANDB_DIR).exists():  # ours: `run --overwrite` may clear it
            (self.run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
            write_marker(self.run_dir / WANDB_DIR, WANDB_DIR)
        for var, sub in (
            ("WANDB_CACHE_DIR", "cache"),
            ("WANDB_CONFIG_DIR", "config"),
            ("WANDB_DATA_DIR", "data"),
        ):  # W&B's own files under the run directory, not in HOME (module doc)
            if os.environ.get(var) in (None, _WANDB_DIRS_SET.get(var)):  # not the user's
                os.environ[var] = _WANDB_DIRS_SET[var] = str(self.run_dir / WANDB_DIR / sub)
        import wandb

        settings = wandb.Settings(
            init_timeout=float(cfg.output.tracker_timeout_s),
            silent=True,
            console="off",
            x_disable_stats=True,
            disable_git=True,
            save_code=False,
            x_save_requirements=False,
            x_disable_machine_info=True,
        )
        self.run = wandb.init(
            project=cfg.output.tracker_project,
            name=self.run_dir.name,
            group=cfg.output.tracker_group,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            config=config,
            settings=settings,
        )
        self.id = run_id

    def state(self):
        return {"id": self.id}

    def log_round(self, step, values):
        self.run.log(dict(values), step=step)

    def log_results(self, summary, values, files):
        self.run.summary.update(values)
        for path in files:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self):
        import wandb

        self.run.finish()
        wandb.teardown()  # the W&B service process belongs to this run's process

    def abandon(self, thread=None):
        stop_wandb_service(thread)


_WANDB_DIRS_SET: dict[str, str] = {}  # W&B directory variables this process set (per run)


def stop_wandb_service(thread=None, wait_s: float = 30.0) -> None:
    """Stop W&B's service process (``wandb-core``, a child of this process) without
    waiting on it: a dropped W&B run leaves no process behind. ``thread``: an abandoned
    call still inside W&B (it may start the service late); its service is stopped until
    the call gives up (at most ``wait_s`` seconds)."""
    import signal
    import time

    def kill_all() -> None:
        for pid in _wandb_service_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # our child: reaped, no zombie left
            except OSError:
                pass

    deadline = time.monotonic() + wait_s
    while True:
        kill_all()
        if thread is None or not thread.is_alive() or time.monotonic() > deadline:
            break
        thread.join(0.2)
    kill_all()
    try:
        import wandb

        wandb.teardown()  # forget the (now gone) service; quick once it is dead
    except Exception:  # noqa: BLE001 - best effort
        pass


def _wandb_service_pids() -> list[int]:
    """PIDs of this process's children running W&B's service (``wandb-core``)."""
    me = str(os.getpid())
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            ppid = stat.rsplit(")", 1)[1].split()[1]
            if ppid == me and b"wandb" in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids
