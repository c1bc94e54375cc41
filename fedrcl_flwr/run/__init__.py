"""The worker's runtime and the run records, below the clients and strategies: the
worker's caches (``runtime``), checkpoints, the run-directory files and their writers
(``run_files``, ``results``) and the stage timers. What launches runs (processes, plans,
pre-run checks, sweeps) is ``fedrcl_flwr.launch``, above the Flower adapters."""
