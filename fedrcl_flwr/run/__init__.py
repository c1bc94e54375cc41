"""Running experiments, in two layers (README, "Architecture"). The worker's runtime and
the run records, below the clients and strategies: the worker's caches (``runtime``),
checkpoints, the run-directory files and their writers (``run_files``, ``results``) and
the stage timers. The orchestration, above the Flower adapters: the process primitives
(``processes``), the planned runs (``plan``), the pre-run checks (``preflight``) and the
sweep; ``fedrcl_flwr.runner`` (the Flower process driver) sits beside the sweep."""
