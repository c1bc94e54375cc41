"""Reporting finished runs: tables against the papers' numbers and plots. Reading the run
directories (:mod:`~fedrcl_flwr.report.reading`), the reported metric
(:mod:`~fedrcl_flwr.report.metrics`), the cells, rows and columns and the paired comparison
(:mod:`~fedrcl_flwr.report.grouping`), the table as Markdown, CSV or LaTeX
(:mod:`~fedrcl_flwr.report.formats`) and the figures (:mod:`~fedrcl_flwr.report.figures`).
Nothing here imports Flower."""
