"""Running experiments: the pre-run checks (``preflight``), the sweep, the worker's caches
(``runtime``), checkpoints, the run-directory files and their writers (``run_files``,
``results``) and the stage timers. ``fedrcl_flwr.runner`` (the Flower process driver)
stays a top-level module: its path is part of the tool's interface (``python -m
fedrcl_flwr.runner watch``)."""
