"""TensorBoard: one ``torch.utils.tensorboard.SummaryWriter`` writing
``<run dir>/tensorboard/``; it rewrites the rounds after a checkpoint (``purge_step``)."""

from __future__ import annotations

import json
from pathlib import Path

from fedrcl_flwr.run.run_files import TENSORBOARD_DIR as TB_DIR
from fedrcl_flwr.tracking.backend import Backend


class TensorBoardBackend(Backend):
    name = "tensorboard"
    rewrites_after_resume = True

    def __init__(self, run_dir: Path, config_yaml: str, resume_after: int):
        from torch.utils.tensorboard import SummaryWriter

        from fedrcl_flwr.run.results import write_marker

        kwargs = {"purge_step": resume_after + 1} if resume_after else {}
        tb_dir = Path(run_dir) / TB_DIR
        created = not tb_dir.exists()
        self.writer = SummaryWriter(log_dir=str(tb_dir), **kwargs)
        if created:  # ours: `run --overwrite` may clear it
            tb_dir.mkdir(parents=True, exist_ok=True)
            write_marker(tb_dir, TB_DIR)
        if not resume_after:
            self.writer.add_text("config", "```yaml\n" + config_yaml + "```", 0)
        self.writer.flush()

    def log_round(self, step, values):
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def log_results(self, summary, values, files):
        step = int(summary.get("rounds") or 0)
        self.writer.add_text("summary", "```json\n" + json.dumps(summary, indent=2) + "\n```", step)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        for path in files:
            if path.suffix == ".png":
                import matplotlib.image as mpimg

                self.writer.add_image(
                    f"plots/{path.stem}", mpimg.imread(str(path)), step, dataformats="HWC"
                )
        self.writer.flush()

    def close(self):
        self.writer.close()
