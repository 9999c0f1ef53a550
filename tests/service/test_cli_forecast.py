"""`ptctl forecast`: a finished study's validate sweeps forecast the optimal lr of any target, before it trains.
The study folder is written by hand from forecast_cpu's planned grid with losses that follow a known law (no
training), and the command runs as a user runs it."""

from __future__ import annotations

from studies.phases import StudyState, TuneResult
from tests.service._cli import data_dir, ptctl
from tests.studies.test_forecast_phase import CENTRE, SPEC, _optimum, _table
from workers.folder import StudyFolder

STUDY = "forecast-cpu-0123456789"


def _study(tmp_path):
    data = data_dir(tmp_path, "data")
    folder = StudyFolder(STUDY, data).create()
    folder.spec.write_text(SPEC.to_yaml())
    _table().to_csv(folder.trials("validate"), index=False)
    state = StudyState(study_id=STUDY, spec_hash=SPEC.content_hash(),
                       phases={"tune": TuneResult(status="done", best_hparams=CENTRE, best_eval_loss=5.0)})
    folder.state_path.write_text(state.model_dump_json())
    return data


def test_the_forecast_of_any_target_is_printed_with_its_interval(tmp_path):
    data = _study(tmp_path)
    done = ptctl(["forecast", STUDY, "--width", "1024", "--steps", "1200"], data)
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "Forecast of mup's optimal lr at width 1024, 1200 steps, batch 16:" in said
    predicted = float(said.split("(log2 ")[1].split(")")[0])
    assert abs(predicted - _optimum(1024, 1200)) < 0.15  # the law the losses were written from
    assert "[95 %" in said and f"transferred lr {CENTRE['lr']:.3g}" in said and "held out (width 128" in said


def test_a_bad_target_or_a_study_without_sweeps_is_named(tmp_path):
    data = _study(tmp_path)
    done = ptctl(["forecast", STUDY, "--steps", "0"], data)
    assert done.returncode != 0 and "--steps 0: give a positive integer" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    done = ptctl(["forecast", "nope"], data)
    assert done.returncode != 0 and "no spec.yaml for study 'nope'" in " ".join((done.stdout + done.stderr).split())


def test_the_forecast_is_local_only_and_refuses_a_server(tmp_path):
    """The API has no forecast: `--server` is refused with why (not run against the local folder), and the help says
    that the command reads the study's folder here."""
    data = _study(tmp_path)
    done = ptctl(["forecast", STUDY, "--server", "http://127.0.0.1:9"], data)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2 and "Traceback" not in said and "Forecast of" not in said, said
    assert "--server http://127.0.0.1:9: ptctl forecast reads the study's folder on this machine" in said
    assert "the API, which has no forecast endpoint" in said
    helped = " ".join(ptctl(["forecast", "--help"], data).stdout.split())
    assert "reads the study's folder on this machine ($PTCTL_DATA_DIR/studies/ID), not the API" in helped
