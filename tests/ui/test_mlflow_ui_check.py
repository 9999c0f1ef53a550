"""The headless-browser check of the MLflow UI says why it cannot run where Chromium or Playwright is missing
(the browser test itself: tests/workers/test_study_engine.py::test_mlflow_ui_in_a_headless_browser)."""

from tests.ui.mlflow_ui_check import UICheck, main, missing_requirements


def test_no_browser_is_a_reason_not_a_crash(tmp_path, capsys):
    reason = missing_requirements(str(tmp_path / "no-chromium"))
    assert reason is not None and ("no Chromium at" in reason or "Playwright" in reason)
    assert main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "shots"),
                 "--chromium", str(tmp_path / "no-chromium")]) == 2
    assert "cannot run:" in capsys.readouterr().err


def test_expectations_name_what_did_not_show():
    check = UICheck(texts={"runs_table": "tune-03 lr=2.4e-2 certified"})
    check.expect("runs_table", "certified", "upper_bound", r"re:tune-\d\d lr=")
    assert check.problems == ["runs_table: 'upper_bound' not shown"]
