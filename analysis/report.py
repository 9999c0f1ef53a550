"""The study report as Markdown: spec summary, one compact section per phase (each phase writes its own,
`studies.phases.base.Phase.section`, with the helpers here), verdicts and figure links; and the same report as
one self-contained HTML page (`report_html`), its figures inline."""

from __future__ import annotations

import base64
import html
import math
import mimetypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.certificate import Certificate
from analysis.forecast import Forecast, HeldOut, LeaveOut, forecast_line
from analysis.regret import Regret, regret_line
from analysis.table import STATUSES, judged_loss, loss_spread, phase_rows
from analysis.transfer import LRDrift

SUMMARY_KEYS: tuple[str, ...] = ("model", "base_width", "widths", "budget", "families", "budgets", "tokens")
"""The spec keys echoed in the report's summary, when the study dict has them."""


def markdown_table(df: pd.DataFrame) -> str:
    """`df` as a GitHub Markdown table (no `tabulate` needed, unlike `DataFrame.to_markdown`)."""
    header = "| " + " | ".join(_cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _cell(value: Any) -> str:
    """One table cell: floats to 5 significant digits, NaN/None as an em dash, pipes escaped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.5g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ", ".join(_cell(v) for v in value)
    return str(value).replace("|", "\\|")


def render_report(
    *,
    study: Mapping[str, Any],
    phases: Sequence[str],
    sections: Mapping[str, Sequence[str]],
    plots: Mapping[str, str],
    tables: Mapping[str, pd.DataFrame],
    headline: Mapping[str, tuple[str, str, str]],
    cost: Mapping[str, Any] | None = None,
    flags: Sequence[str] = (),
) -> str:
    """A study's Markdown report: `study` (the spec as a dict plus `id` or `study_id`: the title, and the keys of
    `SUMMARY_KEYS`), then each of `phases` (every phase's name, in order) with its `sections` paragraphs and the
    `plots` named after it (figure name → PNG path; `validate (w_H)` is validate's, `coord` goes under "figures"),
    but a `headline` figure (name → title, caption, the line left in its section), which goes first; then `cost`
    (`studies.cost.measured_cost`'s account) and the batched trials of `tables`. `flags`: warnings about the
    study's design, bold in the first phase's section."""
    study_id = study.get("id", study.get("study_id"))
    title = f"# Study {study.get('name', 'unnamed')}" + (f" (`{study_id}`)" if study_id else "")
    summary = [f"- **{k}**: {_cell(study[k])}" for k in SUMMARY_KEYS if k in study]
    parts = {name: list(paragraphs) for name, paragraphs in sections.items() if paragraphs}
    if flags:
        parts.setdefault(phases[0], []).extend(f"**{flag}**" for flag in flags)
    top: list[str] = []
    for name, path in plots.items():
        phase = name.split(" (")[0]  # "validate (w_H)": another figure of the validate phase
        if name in headline:
            heading, caption, line = headline[name]
            top = [f"## {heading}", f"{caption}\n\n![{name}]({path})"]
            parts.setdefault(phase, []).append(line)
            continue
        parts.setdefault(phase if phase in phases else "figures", []).append(f"![{name}]({path})")
    if cost and cost.get("rows"):
        parts["cost"] = [cost_section(cost)]
    batched = batches_line(tables)
    if batched:
        parts.setdefault("cost", []).append(batched)
    out = [title, *top, "## spec", "\n".join(summary) or "_no spec summary given_"]
    for name in (*phases, "cost", "figures"):
        if name in parts:
            out += [f"## {name}", *parts[name]]
    return "\n\n".join(out) + "\n"


REPORT_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; font-size: 14px;
       line-height: 1.45; color: #1f2328; margin: 16px; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #d1d9e0; padding-bottom: 2px; }
table { border-collapse: collapse; margin: 8px 0; } th, td { border: 1px solid #d1d9e0; padding: 3px 8px; }
th { background: #f6f8fa; } td { font-variant-numeric: tabular-nums; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; } img { max-width: 100%; }
"""


def report_html(markdown: str, figures: Path) -> str:
    """The Markdown report as one HTML page that needs no other file: each figure it links by a bare file name
    found in `figures` is inlined as a `data:` URI. MLflow's artifact view shows this page whole, while in its
    view of `report.md` a relative image (`![tune](tune_history.png)`) stays text: it renders only images
    with an absolute URL."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = parser.parse(markdown)
    title = next((tokens[i + 1].content.replace("`", "") for i, t in enumerate(tokens) if t.type == "heading_open"),
                 "Study report")
    for token in tokens:
        for child in token.children or ():
            src = str(child.attrGet("src") or "") if child.type == "image" else ""
            path = figures / src
            if src and Path(src).name == src and path.is_file():
                kind = mimetypes.guess_type(src)[0] or "application/octet-stream"
                child.attrSet("src", f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}")
    body = parser.renderer.render(tokens, parser.options, {})
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{REPORT_CSS}</style></head>\n<body>\n{body}</body></html>\n")


def tune_section(table: pd.DataFrame, hparams: Sequence[str], top: int = 5) -> str:
    """Trial counts per status and the `top` trials by eval loss with their hparams."""
    rows = phase_rows(table, "tune")
    counts = rows["status"].value_counts().reindex(list(STATUSES), fill_value=0)
    count_line = ", ".join(f"{n} {status}" for status, n in counts.items())
    loss = judged_loss(rows)
    best = rows.loc[loss[loss < math.inf].nsmallest(top).index]
    columns = [c for c in ("trial_id", "width", "status", "eval_loss", *hparams) if c in best.columns]
    top_table = markdown_table(best[columns])
    return f"{len(rows)} trials: {count_line}.\n\nTop {len(best)} by eval loss:\n\n{top_table}"


def compare_section(table: pd.DataFrame) -> str:
    """Per budget, each family's width, counted parameters, training FLOPs and eval loss over seeds."""
    from analysis.family_ranking import compare_table  # only here: it loads matplotlib; every trial loads this module

    summary = compare_table(table)
    summary["eval_loss"] = [loss_spread(m, s) for m, s in zip(summary["eval_loss_mean"], summary["eval_loss_std"],
                                                               strict=True)]
    columns = ["budget", "family", "role", "width", "params", "train_flops", "n_seeds", "n_diverged", "eval_loss",
               "eval_loss_min", "eval_loss_max", "rank"]
    note = ("Parameters are the models' own counts (`sum(p.numel())`); training FLOPs are matmul FLOPs from the "
            "shapes, 3 × forward (`studies.budget`). eval_loss: mean ± std over seeds.")
    return f"{note}\n\n{markdown_table(summary[columns])}"


def verify_section(cert: Certificate) -> str:
    """The certificate's verdict in bold, then its fields as a two-column table."""
    fields = cert.model_dump(exclude={"verdict"})
    table = pd.DataFrame({"field": list(fields), "value": list(fields.values())})
    return (
        f"**{'certified' if cert.certified else 'not certified'}**: {cert.verdict}\n\n{markdown_table(table)}"
    )


def drift_section(drift: LRDrift, column: str = "width", words: str = "width") -> str:
    """The drift verdict, the drift per parametrization (with its interval over seeds), and the optimum per width
    (along another axis: per value of its `column`, said per doubling of `words`)."""
    per_doubling = [round(d, 3) + 0.0 for d in drift.drift.values()]  # + 0.0 turns -0.0 into 0.0
    intervals = [drift.drift_ci.get(p) for p in drift.drift]
    of = "" if drift.axis == "width" else f" of {words}"
    drifts = pd.DataFrame(
        {"parametrization": list(drift.drift), f"drift (log2 {drift.hparam} per doubling{of})": per_doubling,
         "95 % CI over seeds": [f"[{c[0]:+.2f}, {c[1]:+.2f}]" if c else "—" for c in intervals]}
    )
    optima = pd.DataFrame([{**o.model_dump(exclude={"at"}), **({column: o.at} if o.at is not None else {})}
                           for o in drift.optima])
    status = "pass" if drift.passed else "fail"
    return f"**{status}**: {drift.verdict}\n\n{markdown_table(drifts)}\n\n{markdown_table(optima)}"


def forecast_section(forecast: Forecast) -> str:
    """The target's lr forecast: its line in bold, the fit's coefficients with their intervals, and each scored point
    (held out, the target's own sweep) with the forecast's and Step Law's errors."""
    def r(x: float | None) -> float | None:  # 3 decimals, -0.0 as 0.0
        return None if x is None else round(x, 3) + 0.0

    fit = pd.DataFrame({"term": list(forecast.coefficients),
                        "log2 lr per doubling": [r(c) for c in forecast.coefficients.values()],
                        "95 % CI": [f"[{round(c[0], 2) + 0.0:+.2f}, {round(c[1], 2) + 0.0:+.2f}]" if c else "—"
                                    for c in forecast.coefficient_ci.values()]})
    scored: list[tuple[str, HeldOut]] = [(what, h) for what, h in (("held out", forecast.held_out),
                                                                   ("target's own sweep", forecast.target_check)) if h]
    points = pd.DataFrame([{"point": what, "width": h.width, "steps": h.steps, "batch": h.batch_size,
                            "observed log2 lr": r(h.observed_log2_lr), "forecast log2 lr": r(h.predicted_log2_lr),
                            "error (log2)": r(h.error_log2), "regret (nats)": h.regret,
                            "Step Law log2 lr": r(h.steplaw_log2_lr), "Step Law error (log2)": r(h.steplaw_error_log2),
                            "Step Law regret (nats)": h.steplaw_regret, "fitted optima": h.n_fit,
                            "note": h.note or "—"} for what, h in scored])
    note = (f"One OLS fit of log2 η* over {forecast.n_points} per-seed optima of the {forecast.parametrization} lr "
            "sweeps (`analysis.forecast`); Step Law: η*(N, D) = 1.79 · N^−0.713 · D^0.307 (arXiv:2503.04715), fitted "
            "on far larger LLMs." + (f" {forecast.note}." if forecast.note else ""))
    out = forecast.leave_out
    tables = [markdown_table(fit), *([markdown_table(points)] if scored else [])]
    if out is not None and out.points:
        tables += [_leave_out_note(out), markdown_table(pd.DataFrame([
            {"width": h.width, "steps": h.steps, "batch": h.batch_size, "seq_len": h.seq_len,
             "observed log2 lr": r(h.observed_log2_lr), "forecast log2 lr": r(h.predicted_log2_lr),
             "error (log2)": r(h.error_log2), "regret (nats)": h.regret,
             "t-interval covered": "—" if h.covered is None else ("yes" if h.covered else "no"),
             "|error| / se": r(abs(h.error_log2) / h.se) if h.se else None,
             "Step Law error (log2)": r(h.steplaw_error_log2), "fitted optima": h.n_fit} for h in out.points]))]
    return "\n\n".join([f"**{forecast_line(forecast)}**", note, *tables])


def _leave_out_note(out: LeaveOut) -> str:
    """What the leave-out table is, and each interval's coverage on it."""
    source = {"leave-out": "the 95 % split-conformal quantile of these points' |error| / se",
              "pooled": "the multiplier pooled over the catalog's studies, `analysis.forecast.POOLED_MULTIPLIERS`",
              "max": f"the largest of these points' |error| / se, a {100 * (out.level or 0):.0f} % interval"}
    conformal = (f"the conformal interval (±{out.multiplier:.2f} standard errors, {source[out.source]}) covered "
                 f"{out.covered}/{out.scored}" if out.multiplier is not None and out.covered is not None
                 else f"no conformal coverage ({out.note})")
    skipped = f" Not predictable: {'; '.join(out.skipped)}." if out.skipped else ""
    return (f"Every swept point predicted by a fit without its width (and, with three or more horizons, its "
            f"horizon): the nominal 95 % t-interval (of the law's mean) covered {out.t_covered}/{out.t_scored} "
            f"observed optima; {conformal}.{skipped}")


def regret_section(regret: Sequence[Regret]) -> str:
    """What transfer cost: one bold line per swept hparam, then every (hparam, parametrization, width) regret."""
    lines = [f"**{line}**" for h in dict.fromkeys(r.hparam for r in regret) if (line := regret_line(regret, h))]
    rows = pd.DataFrame([{"hparam": r.hparam, "parametrization": r.parametrization, "width": r.width,
                          "transferred": r.transferred, "optimum": r.optimum, "optimum_loss": r.optimum_loss,
                          "regret (nats)": r.regret, "regret %": r.regret_pct,
                          "95 % CI (nats)": f"[{r.ci[0]:+.3g}, {r.ci[1]:+.3g}]" if r.ci else "—",
                          "seeds": r.n_seeds, "note": r.note or "—"} for r in regret])
    return "\n\n".join([*lines, markdown_table(rows)])


def batches_line(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """How the grid phases' trials were packed: per phase, the trials trained as members of a batched model and the
    members of each batch (a trial table's `batch` column); None when none was."""
    parts = []
    for phase, table in tables.items():
        if "batch" not in table or table["batch"].isna().all():
            continue
        sizes = table.dropna(subset=["batch"]).groupby("batch", sort=True).size()
        parts.append(f"{phase}: {int(sizes.sum())} of {len(table)} trials in {len(sizes)} batched "
                     f"process{'es' if len(sizes) > 1 else ''} ({', '.join(str(int(n)) for n in sizes)} members)")
    return "**batched trials:** " + "; ".join(parts) if parts else None


def _pct(part: float | None, whole: float | None) -> float | None:
    return 100 * part / whole if part is not None and whole else None


def cost_line(cost: Mapping[str, Any]) -> str:
    """"proxy cost = X % of one target run at width W": tune, then tune + verify + validate, at the widest target,
    in FLOPs and in wall time (Σ trial wall time against the median transfer run at W)."""
    targets = cost.get("targets") or {}
    if not targets:
        return "no transfer width: no target run to compare the proxy with"
    width = max(targets, key=int)
    target, rows = targets[width], cost["rows"]
    checks = [r for r in rows if r["phase"] in ("tune", "verify", "validate")]
    parts = []
    for what, chosen in (("proxy cost", [r for r in rows if r["phase"] == "tune"]),
                         (" + ".join(r["phase"] for r in checks), checks)):
        flops = None if any(r["flops"] is None for r in chosen) else sum(r["flops"] for r in chosen)
        by_flops, by_wall = _pct(flops, target["flops"]), _pct(sum(r["trial_wall_s"] for r in chosen), target["wall_s"])
        shares = [f"{v:.1f} % {unit}" for v, unit in ((by_flops, "FLOPs"), (by_wall, "wall time")) if v is not None]
        parts.append(f"{what} = {' / '.join(shares) or '—'}")
    return f"{parts[0]} of one target run at width {width}; {parts[1]}"


def cost_section(cost: Mapping[str, Any]) -> str:
    """Per phase: trials, steps run, training FLOPs and Σ trial wall time, each also as % of one run at the widest
    target width; then the proxy-cost line (μP paper: tuning GPT-3 6.7B's proxy cost ≈ 7 % of one pretraining run)."""
    targets = cost.get("targets") or {}
    width = max(targets, key=int) if targets else None
    target = targets.get(width, {})
    rows = [{"phase": r["phase"], "trials": r["trials"], "steps": r["steps"], "FLOPs": r["flops"],
             **({f"% of w{width} run (FLOPs)": _pct(r["flops"], target.get("flops"))} if width else {}),
             "Σ trial wall s": r["trial_wall_s"],
             **({f"% of w{width} run (wall)": _pct(r["trial_wall_s"], target.get("wall_s"))} if width else {}),
             "phase wall s": r.get("phase_wall_s")} for r in cost["rows"]]
    note = ("Training FLOPs are matmul FLOPs from the shapes (3 × forward, `studies.budget`) of the steps each trial "
            "ran; the target is one run of train.steps at the width, its wall time the median transfer run there.")
    return f"**{cost_line(cost)}**\n\n{note}\n\n{markdown_table(pd.DataFrame(rows))}"
