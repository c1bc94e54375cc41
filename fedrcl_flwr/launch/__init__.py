"""Launching experiments, above the Flower adapters: the process primitives
(``processes``), the planned runs (``plan``), the pre-run checks (``preflight``) and the
sweep. ``fedrcl_flwr.runner`` (the Flower process driver) sits beside them and
``fedrcl_flwr.cli`` above."""
