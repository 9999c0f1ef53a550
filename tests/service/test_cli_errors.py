"""Bad command lines end with one clear line naming the fix and exit code 2, never a traceback."""

import pytest

from service import cli


@pytest.fixture
def run(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(cli.console, "width", 200)

    def _run(*argv):
        code = cli.main(list(argv))
        out = capsys.readouterr()
        return code, out.out + out.err

    return _run


def test_bad_widths(run):
    code, out = run("coord-check", "--widths", "32,abc")
    assert code == 2 and "--widths" in out and "comma-separated" in out and "Traceback" not in out


def test_a_paradigm_is_one_the_family_declares(run):
    for model, paradigm, theirs in (("bert", "rank", "[]"), ("pt", "heads", "['channels', 'rank']")):
        code, out = run("coord-check", "--model", model, "--paradigm", paradigm)
        assert code == 2 and f"the {model} family's paradigms are {theirs}" in out and "Traceback" not in out, out


def test_invalid_spec_names_the_field(run, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntune: {base_width: 16}\ntransfer: {widths: [8]}\nverify: {delta: 1.5}\n")
    code, out = run("study", "run", str(spec))
    assert code == 2
    assert "verify.delta" in out and "less than 1" in out and "Traceback" not in out


def test_unknown_key_in_spec(run, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntune: {base_width: 16, trials: 3}\ntransfer: {widths: [32]}\n")
    code, out = run("study", "run", str(spec))
    assert code == 2 and "tune.trials: unknown key; did you mean num_trials?" in out


def test_a_misspelt_spec_field_names_the_nearest_and_the_valid_ones(run, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntune: {base_width: 16}\ntransfer: {widths: [32]}\ntrain: {batchsize: 8}\n")
    code, out = run("study", "plan", str(spec))
    assert code == 2 and out.startswith(f"error: {spec} is not a valid study spec:\n"), out
    assert "  train.batchsize: unknown key; did you mean batch_size? (valid keys here: steps, batch_size, " in out
    assert "Extra inputs" not in out and "Traceback" not in out


def test_spec_messages_do_not_repeat_themselves(run, tmp_path):
    """No pydantic "Value error, " prefix, no "(top level)", no field named twice on one line."""
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntune: {base_width: 16}\ntransfer: {widths: [8]}\n"
                    "validate: {widths: [16, 32], lrs: [0.1, 0.1, 0.2]}\nresources: {storage: rel}\n")
    code, out = run("study", "plan", str(spec))
    assert code == 2
    assert "  validate.lrs [0.1, 0.1, 0.2] must be distinct" in out
    assert "  resources.storage='rel': give an absolute path" in out
    assert "Value error" not in out and "(top level)" not in out and "resources.storage: resources" not in out


def test_missing_spec_file(run):
    code, out = run("study", "run", "nowhere.yaml")
    assert code == 2 and "no spec file" in out


def test_transfer_to_a_narrower_width(run):
    """The cross-field check of the spec, said with the flags typed (it once read `(top level): Value error,
    transfer.widths[0]=64 must be > tune.base_width=128`)."""
    code, out = run("transfer", "--to", "64", "--from-width", "128", "--dry-run")
    assert code == 2, out
    assert out.strip() == ("error: --to 64 must be > --from-width 128 (transfer goes wider): drop it or lower "
                           "--from-width"), out


@pytest.mark.parametrize(("argv", "line"), [
    (["--from-width", "-32", "--to", "64"], "error: --from-width -32: must be greater than 0"),
    (["--from-width", "16", "--to", "32", "--trials", "0"], "error: --trials 0: must be greater than 0"),
])
def test_a_bad_transfer_flag_names_the_flag_and_its_range(run, argv, line):
    code, out = run("transfer", *argv, "--dry-run")
    assert code == 2 and out.strip() == line, out
    assert "tune." not in out and "not a valid study spec" not in out


def test_a_bad_verify_flag_names_the_flag_and_its_whole_range(run):
    from studies import load_catalog
    from workers.folder import StudyFolder

    StudyFolder("s1").create().spec.write_text(load_catalog("tiny").to_yaml())  # under the fixture's data dir
    code, out = run("verify", "s1", "--delta", "1.5")
    assert code == 2 and out.strip() == "error: --delta 1.5: must be less than 1 (allowed: 0 < delta < 1)", out
    code, out = run("verify", "s1", "--tolerance", "loose")
    assert code == 2 and out.strip() == ("error: --tolerance loose: must be 'seed_spread' or 'seed_noise'; or must be "
                                         "a valid number, unable to parse string as a number"), out


@pytest.mark.parametrize(("argv", "line"), [
    (["--batch-size", "0"], "error: --batch-size 0: must be greater than 0"),
    (["--source", "text"], "error: --path is required with source 'text', e.g. path: corpus/*.txt"),
    (["--width", "-3"], "error: --width -3: must be greater than 0"),  # base_width (its default) is said once
    (["--set", "n_iter=0"], "error: --set n_iter=0: must be greater than 0"),
])
def test_a_bad_train_flag_names_the_flag(run, argv, line):
    code, out = run("train", "--steps", "1", *argv)
    assert code == 2 and out.strip() == line, out


def test_report_of_unknown_study(run):
    code, out = run("report", "nope")
    assert code == 2 and "no report.md for study 'nope'" in out


def test_bad_set_value(run):
    code, out = run("train", "--set", "n_iter")
    assert code == 2 and "key=value" in out


def test_unknown_model_hparam(run, tmp_path, monkeypatch):
    from tests.service._cli import data_dir

    monkeypatch.setenv("PTCTL_DATA_DIR", str(data_dir(tmp_path, "data")))  # the shared corpus: no download
    code, out = run("train", "--steps", "1", "--set", "bogus=1", "--max-tokens", "20000")
    assert code == 2 and "bogus" in out and "valid ones" in out


def test_laplacian_builds_a_usable_file_and_names_a_missing_input(run, tmp_path):
    np = pytest.importorskip("numpy")
    from workers.laplacian import load_laplacian

    rng = np.random.default_rng(0)
    np.save(tmp_path / "emb.npy", rng.normal(size=(500, 24)) @ rng.normal(size=(24, 24)))
    code, out = run("laplacian", str(tmp_path / "emb.npy"), "--dim", "16", "--clusters", "40",
                    "--out", str(tmp_path / "L.npy"))
    assert code == 0 and "components" in out and "laplacian: file" in out
    assert load_laplacian(str(tmp_path / "L.npy"), 16).shape == (16, 16)  # a checked Laplacian
    code, out = run("laplacian", str(tmp_path / "missing.npy"), "--dim", "16")
    assert code == 2 and "no embeddings file" in out and "numpy.save" in out and "Traceback" not in out
    code, out = run("laplacian", str(tmp_path / "emb.npy"), "--dim", "32")
    assert code == 2 and "fewer than the Laplacian size 32" in out


# ---------------------------------------------------------------------------------- the error policy
def test_a_bug_prints_its_traceback(run, monkeypatch):
    """Only ptctl's own errors are one line: a ValueError from inside a library is a bug and propagates."""
    def broken(spec):
        raise ValueError("cannot reindex on an axis with duplicate labels")  # e.g. pandas, deep in a command

    monkeypatch.setattr(cli, "_print_plan", broken)
    with pytest.raises(ValueError, match="duplicate labels"):
        run("study", "plan", str(cli.Path(cli.__file__).parents[1] / "studies" / "catalog" / "tiny.yaml"))


def test_an_unreachable_server_is_one_line(run):
    for argv in (["study", "list"], ["study", "report", "x"], ["report", "x"]):
        code, out = run(*argv, "--server", "http://127.0.0.1:9")
        assert code == 2 and out.startswith("error: cannot reach the ptctl server at http://127.0.0.1:9"), out
        assert "Traceback" not in out


def test_coord_check_writes_under_the_data_directory_by_default(run, tmp_path, monkeypatch):
    from tests.service._cli import data_dir

    data = data_dir(tmp_path, "data")
    monkeypatch.setenv("PTCTL_DATA_DIR", str(data))
    monkeypatch.chdir(tmp_path)
    code, out = run("coord-check", "--widths", "16,32", "--steps", "2", "--seeds", "2", "--max-seeds", "2")
    assert code in (0, 1, 3), out
    written = sorted(p.name for p in (data / "coord_check").iterdir())
    assert written == ["coord_pt_mup_channels.csv", "coord_pt_mup_channels.png"], written
    assert f"wrote {data / 'coord_check' / 'coord_pt_mup_channels.csv'}" in out.replace("\n", "")
    assert not (tmp_path / "coord_check").exists()  # not into the current directory
