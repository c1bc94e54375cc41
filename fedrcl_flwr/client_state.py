"""Per-client persistent state (MOON's previous model, FedDyn's gradient correction, ...).

Virtual clients are created anew for every message and a Ray worker serves many of them,
so state cannot live in memory: it is stored on disk, one file per partition id, under
the run directory (``client_state/``) in simulation, or under the node's ``state-dir`` on
a real device. Only the clients that have trained keep a file; tensors are stored in
float16 when ``compact=True`` (half the bytes; MOON only needs the previous model's
features approximately) — e.g. 500 clients × CNN5 (≈2.2 M params) ≈ 2.2 GB in fp16 on
disk, zero in RAM. Writes are atomic (temporary file + rename), so a killed run never
leaves a torn state file, and resumed runs find the state as of their last write.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from fedrcl_flwr.run.run_files import new_file


class ClientStateStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def _path(self, partition_id: int, name: str) -> Path:
        return self.root / f"{name}_{int(partition_id)}.pt"

    def save(self, partition_id: int, name: str, state: dict, *, compact: bool = False) -> None:
        if not self.root.is_dir():
            from fedrcl_flwr.run.results import write_marker

            self.root.mkdir(parents=True, exist_ok=True)
            write_marker(self.root, self.root.name)  # ours: `run --overwrite` may clear it
        if compact:
            state = {
                k: (v.half() if torch.is_tensor(v) and v.is_floating_point() else v)
                for k, v in state.items()
            }
        state = {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in state.items()}
        path = self._path(partition_id, name)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        with new_file(tmp) as fh:  # never through a link planted at that name
            torch.save(state, fh)
        os.replace(tmp, path)

    def load(
        self, partition_id: int, name: str, *, dtype: torch.dtype | None = None
    ) -> dict | None:
        path = self._path(partition_id, name)
        if not path.exists():
            return None
        from fedrcl_flwr.serialization import safe_load

        state = safe_load(path, "client state file")
        if dtype is not None:
            state = {
                k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v)
                for k, v in state.items()
            }
        return state

    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob("*.pt")) if self.root.exists() else 0
