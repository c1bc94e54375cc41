"""A sweep's "done" line names the metric the study reports (the run's summary
``report_metric``: ``last5``, a domain mean, ...), not the final accuracy."""

import json

from fedrcl_flwr.launch.sweep_status import _reported


def test_done_line_value_is_the_reported_metric(tmp_path):
    summary = {"final_accuracy": 0.9, "last5": 0.8, "last5_domain_mean": 0.7}
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "report_metric": "last5"}))
    assert _reported(tmp_path) == ("last5", 0.8)
    (tmp_path / "summary.json").write_text(
        json.dumps({**summary, "report_metric": "last5_domain_mean"})
    )
    assert _reported(tmp_path) == ("last5_domain_mean", 0.7)
    (tmp_path / "summary.json").write_text(json.dumps({"final_accuracy": 0.9}))
    assert _reported(tmp_path) == ("final", 0.9)  # a summary without report_metric
    (tmp_path / "summary.json").write_text("[1]")
    assert _reported(tmp_path) == ("final", None)
