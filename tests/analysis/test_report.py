"""The Markdown report: verdicts, tables and figure links, with a table writer that needs no tabulate."""

import math

import pandas as pd

from analysis.certificate import certify
from analysis.report import markdown_table, report_html
from analysis.transfer import lr_drift
from studies import load_catalog
from tests.analysis._tables import paper_like_optimum, sweep_table, trials, verify_table
from tests.studies._report import phase_report

STUDY = {
    "name": "pt-mlm",
    "id": "s-42",
    "model": {"family": "pt", "d": 256},
    "widths": [256, 512],
    "budget": "1 epoch",
}


def _tables():
    tune = trials(
        [{"eval_loss": 3.0 + i / 10, "lr": 0.001 * (i + 1)} for i in range(7)]
        + [{"status": "diverged"}, {"status": "stopped", "eval_loss": 3.9}],
        phase="tune",
    )
    transfer = trials(
        [{"width": w, "seed": s, "eval_loss": 3.0 - w / 1000} for w in (256, 512) for s in (0, 1)],
        phase="transfer",
    )
    return {"tune": tune, "transfer": transfer}


SPEC = load_catalog("cpu_demo")
TUNE = {"best_hparams": dict.fromkeys(SPEC.space.HPARAMS, 1.0)}


def _report(study=STUDY, tables=None, plots=None, cost=None, **results) -> str:
    """The report of a cpu_demo-shaped study whose tune phase and `results` (a phase → its result's fields)
    finished, as the driver renders it."""
    return phase_report(SPEC, {"tune": TUNE, **results}, study, tables, plots, cost)


def test_markdown_table_formats_cells():
    df = pd.DataFrame({"a": [1.234567, math.nan], "b": ["x|y", None], "c": [True, False]})
    assert markdown_table(df).splitlines() == [
        "| a | b | c |",
        "|---|---|---|",
        "| 1.2346 | x\\|y | yes |",
        "| — | — | no |",
    ]


def test_report_has_every_phase_verdict_table_and_link():
    cert = certify(verify_table([2.0, 2.01], [2.1] * 62))
    drift = lr_drift(sweep_table(paper_like_optimum))
    plots = {"tune": "tune.png", "verify": "verify.png", "validate": "mutransfer.png", "coord": "coord.png"}
    md = _report(tables=_tables(), plots=plots, transfer={}, verify={"certificate": cert},
                 validate={"lr_drift": drift})
    assert md.startswith("# Study pt-mlm (`s-42`)")
    assert "- **model**: family=pt, d=256" in md and "- **widths**: 256, 512" in md
    # tune: counts and the five best trials only
    assert "9 trials: 7 completed, 1 diverged, 1 stopped, 0 failed." in md
    tune = md.split("## tune")[1].split("## transfer")[0]
    assert "| trial_id | width | status | eval_loss | lr |" in tune
    assert "| t000 |" in tune and "| t004 |" in tune and "| t005 |" not in tune
    # transfer: the per-width table
    assert "| width | params | eval_loss_mean |" in md and "| 512 |" in md
    # verify and validate: verdicts and fields
    assert cert.verdict in md and "**certified**" in md and "| upper_bound | 0.04717 |" in md
    assert drift.verdict in md and "**pass**" in md
    assert "| mup | 0 |" in md and "| standard | -1 |" in md
    # figures: phase figures in their sections, the rest at the end
    assert "![verify](verify.png)" in md.split("## verify")[1].split("## validate")[0]
    # the lr alignment is the headline: first after the title, not repeated in its section
    assert md.split("\n\n")[1] == "## lr alignment (the headline)"
    assert md.count("![validate](mutransfer.png)") == 1 and md.index("![validate]") < md.index("## spec")
    assert "## figures\n\n![coord](coord.png)" in md
    # sections in phase order
    assert md.index("## tune") < md.index("## transfer") < md.index("## verify") < md.index("## validate")


def test_report_without_verdicts_or_plots():
    md = _report(study={"name": "bare"})
    assert md.startswith("# Study bare\n")
    assert "_no spec summary given_" in md
    assert "## verify" not in md and "## validate" not in md


def test_report_shows_a_failed_certificate():
    cert = certify(verify_table([2.0], [1.5] * 3 + [2.1] * 59))
    md = _report(verify={"certificate": cert})
    assert "**not certified**" in md and "NOT certified" in md


def test_cost_section_states_the_proxy_share_of_one_target_run():
    from analysis.report import cost_line

    cost = {"rows": [{"phase": "tune", "trials": 6, "steps": 100, "flops": 7.0e9, "trial_wall_s": 3.0,
                      "phase_wall_s": 9.0},
                     {"phase": "transfer", "trials": 2, "steps": 60, "flops": 2.0e11, "trial_wall_s": 8.0,
                      "phase_wall_s": None},
                     {"phase": "verify", "trials": 8, "steps": 240, "flops": 3.0e10, "trial_wall_s": 12.0,
                      "phase_wall_s": 20.0}],
            "targets": {"32": {"flops": 1.0e10, "wall_s": 4.0}, "64": {"flops": 1.0e11, "wall_s": 4.0}}}
    assert cost_line(cost) == ("proxy cost = 7.0 % FLOPs / 75.0 % wall time of one target run at width 64; "
                               "tune + verify = 37.0 % FLOPs / 375.0 % wall time")
    text = _report(study={"name": "s"}, cost=cost)
    section = text.split("## cost", 1)[1]
    assert "**proxy cost = 7.0 %" in section and "| tune | 6 | 100 | 7e+09 | 7 | 3 | 75 | 9 |" in section
    no_target = _report(study={"name": "s"}, cost={"rows": cost["rows"][:1], "targets": {}})
    assert "no transfer width" in no_target


def test_report_says_where_the_better_neighbours_lie():
    table = verify_table([2.0, 2.01], [1.5] * 3 + [2.1] * 59)
    md = _report(tables={"verify": table}, verify={"certificate": certify(table)})
    verify = md.split("## verify")[1]
    assert "where the better neighbours lie" in verify and "tune.num_trials" in verify


def test_report_html_holds_its_figures_inline(tmp_path):
    """report.html needs no other file: MLflow's artifact view renders no relative image in report.md, so each
    figure the report links by file name is inlined; a link to a missing file or elsewhere is left alone."""
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    (tmp_path / "tune.png").write_bytes(png)
    plots = {"tune": "tune.png", "verify": "verify.png", "coord": "../coord.png"}
    md = _report(tables=_tables(), plots=plots, verify={"certificate": certify(verify_table([2.0, 2.01], [2.1] * 62))})
    page = report_html(md + "\n<script>alert(1)</script>\n", tmp_path)
    assert page.startswith("<!doctype html>") and "<title>Study pt-mlm (s-42)</title>" in page
    assert '<img src="data:image/png;base64,iVBORw0KGgo' in page and 'alt="tune"' in page
    assert '<img src="verify.png" alt="verify"' in page and '<img src="../coord.png"' in page
    assert "<h2>tune</h2>" in page and "<th>trial_id</th>" in page and "<td>t000</td>" in page
    assert "<script>" not in page  # the report's text is escaped, never markup


def test_report_shows_the_noise_expectation_and_blames_noise_for_it():
    # centre 2.0 ± 0.02 over 3 seeds; 15 of 59 samples ahead by 0.03: ≈11.4 expected from seed noise at t = s
    table = verify_table([2.0, 2.02, 1.98], [1.97] * 15 + [2.01] * 44)
    md = _report(tables={"verify": table}, verify={"certificate": certify(table)})
    verify = md.split("## verify")[1]
    assert "| noise_better_rate | 0.19324 |" in verify and "| noise_better_expected | 11.401 |" in verify
    assert "| noise_explains | yes |" in verify
    assert "where the better neighbours lie:** 15 of 59 samples beat the centre, but ≈11.4 of 59" in verify
    assert "verify.tolerance" in verify and "tune.num_trials" not in verify


def test_report_answers_what_transfer_cost_in_one_line():
    from analysis.regret import regret_line, transfer_regret

    sweep = sweep_table(paper_like_optimum)
    regret = transfer_regret(sweep, {"lr": 2.0**-8.5}, [64, 128], proxy_width=64)
    md = _report(validate={"lr_drift": lr_drift(sweep), "regret": regret})
    validate = md.split("## validate")[1]
    line = regret_line(regret)
    assert line is not None and f"**{line}**" in validate.splitlines()
    assert line.startswith("Transfer regret in lr at width 64: mup +0.0125 nats") and "at width 128: mup" in line
    assert "| lr | standard | 128 |" in validate and validate.index("Transfer regret") < validate.index("**pass**")
    unchanged = _report(validate={"lr_drift": lr_drift(sweep)})
    assert "Transfer regret" not in unchanged
