"""Launching experiments, above the Flower adapters: the process primitives
(``processes``), the planned runs (``plan``), the pre-run checks (``preflight``), the
sweep, a run's private SuperLink (``superlink``) and the following of a submitted run
(``follower``). ``fedrcl_flwr.runner`` (the Flower process driver, which submits the run
and drives these steps) sits beside them and ``fedrcl_flwr.cli`` above."""
