"""Reporting finished runs: tables against the papers' numbers and plots
(``fedrcl_flwr.report.tables``). Nothing here imports Flower."""
