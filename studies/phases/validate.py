"""validate: the μTransfer evidence. Short sweeps of lr (and of each of `validate.hparams`) at 2–4 widths under
each parametrization, the other hparams at the centre; `analysis.lr_drift` measures how far the optimum moves
per doubling of width and passes it against `validate.drift_threshold`, and `analysis.transfer_regret` what the
transferred values cost at each swept width that was transferred to (`regret_widths`). With a list of
`validate.steps` (the horizon sweep) lr is also swept at each training length, and the optimum's drift per doubling
of steps is measured at each width (`horizon_drift`; `horizon_flag` says when tune's shorter training makes it
matter). With `validate.depths` (the depth sweep) lr is swept at each depth at the first of `validate.widths`, under
CompleteP and none (`studies.arch.DEPTH_SWEEP`), and the optimum's drift per doubling of depth is measured under each
(`depth_drift`: CompleteP's passes or fails, none's is shown beside it). With `validate.weight_decays` AdamW's λ is
swept like the other hparams, its optimum's drift judged beside lr's, and the optimum read as a timescale
τ* = 1/(ηλ*) and τ*/T per width (`decay_timescales`). With two or more widths under mup, `analysis.forecast` fits
the optimal lr over every lr sweep and forecasts it at the target, scored on a held-out width beside Step Law
(`forecast`, `studies.phases.validate_forecast`). With `validate.batch_sizes` (the batch sweep,
`studies.phases.validate_batch`) lr is also swept at each batch size at every width, its rows kept out of the other
sweeps, and the optimum's drift per doubling of the batch size is measured at each width beside the √B and linear
rules (`batch_drift`), with the regret of carrying the base batch's lr (`batch_regret`; `batch_flag` says when tune's
batch differs from the target's)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import pandas as pd
from rich.markup import escape
from rich.table import Table

import analysis
from analysis import LRDrift, Regret, depth_sweep, lr_drift, regret_line, transfer_regret, without_depth_sweep
from analysis.batch import batch_sweep, without_batch_sweep
from analysis.forecast import Forecast
from analysis.report import drift_section, forecast_section, markdown_table, regret_section
from analysis.transfer import column as axis_column
from analysis.weight_decay import optimum_timescales
from studies.arch import DEPTH_SWEEP
from studies.phases.base import DRIFTS, PASS, Artifacts, Context, Out, Phase, PhaseResult, Verdict, required
from studies.phases.validate_batch import (
    batch_flag,
    batch_lines,
    batch_section,
    batch_trials,
    judge_batch,
    print_batch_flag,
)
from studies.phases.validate_forecast import forecast_metrics, judge_forecast, print_forecast
from studies.plan import PlannedTrial
from studies.space import WEIGHT_DECAY
from studies.spec import StudySpec, ValidateSpec


class ValidateResult(PhaseResult):
    lr_drift: LRDrift | None = None
    hparam_drift: dict[str, LRDrift] = {}  # each of validate.hparams
    regret: list[Regret] = []  # per swept hparam, parametrization and transferred width (`regret_widths`)
    horizon_drift: list[LRDrift] = []  # a horizon sweep's: lr's drift per doubling of steps, one per width
    depth_drift: LRDrift | None = None  # a depth sweep's: lr's drift per doubling of depth, completep and none
    batch_drift: list[LRDrift] = []  # a batch sweep's: lr's drift per doubling of the batch size, one per width
    batch_regret: list[Regret] = []  # a batch sweep's: carrying the base batch's optimal lr, per width and batch
    forecast: Forecast | None = None  # the target's optimal lr fitted over mup's lr sweeps (2+ widths)

    def drifts(self) -> dict[str, LRDrift]:
        """lr's drift, then each other swept hparam's."""
        return {**({"lr": self.lr_drift} if self.lr_drift else {}), **self.hparam_drift}

    def all_drifts(self) -> list[LRDrift]:
        """Every drift: along width (lr's, then the other hparams'), along the horizon, along depth, along the batch
        size."""
        return [*self.drifts().values(), *self.horizon_drift, *([self.depth_drift] if self.depth_drift else []),
                *self.batch_drift]


def validate_trials(spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
    """The sweeps: lr's, then each of `validate.hparams`: every (parametrization, width, value, seed) of the swept
    hparam, the other hparams at the centre. With a list of `validate.steps` (the horizon sweep) lr's sweep runs at
    each of them (`-t<steps>` in the trial key), the others at `spec.validate_horizon()`. With `validate.depths`,
    then lr's sweep at each depth (`depth_trials`); one width and one training length: that depth sweep alone. With
    `validate.batch_sizes`, then lr's sweep at each batch size (`studies.phases.validate_batch.batch_trials`)."""
    v = required(spec.validate_, Validate)
    horizons: list[int | None] = list(v.horizons()) or [None]
    main = spec.validate_horizon() if v.horizons() else None
    sweeps = [PlannedTrial(f"validate-{p}-w{w}{'' if t is None else f'-t{t}'}-{h}{x:.3g}-s{s}", "validate", w, s,
                           {**centre, h: x}, parametrization=p, swept=h, horizon=t)
              for h, values in v.sweeps().items()
              for p in v.parametrizations for w in v.widths for t in (horizons if h == "lr" else [main])
              for x in values for s in range(v.seeds)] if v.width_sweep() else []
    return sweeps + depth_trials(spec, centre) + batch_trials(spec, centre)


def depth_trials(spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
    """The depth sweep (`validate.depths`): every (depth parametrization, depth, lr, seed) at the first of
    `validate.widths` under the model's parametrization, the other hparams at the centre, trained
    `spec.validate_horizon()` steps; `-L<depth>` in the trial key, the depth parametrization in place of the
    parametrization (`validate-completep-w64-L8-lr0.004-s0`). [] without depths."""
    v = required(spec.validate_, Validate)
    width = v.widths[0]
    return [PlannedTrial(f"validate-{d}-w{width}-L{depth}-lr{x:.3g}-s{s}", "validate", width, s, {**centre, "lr": x},
                         swept="lr", depth=depth, depth_parametrization=d)
            for d in DEPTH_SWEEP for depth in v.depths or [] for x in v.lrs for s in range(v.seeds)]


def regret_widths(spec: StudySpec) -> list[int]:
    """The swept widths the study transferred to: those in both `transfer.widths` and `validate.widths`, and the
    tune base width when it is swept."""
    v = required(spec.validate_, Validate)
    transferred = {spec.tune.base_width, *(spec.transfer.widths if spec.transfer is not None else [])}
    return [w for w in v.widths if w in transferred]


def regret_lines(result: ValidateResult) -> list[str]:
    """`analysis.regret_line` for each swept hparam with a regret, lr first."""
    hparams = dict.fromkeys(r.hparam for r in result.regret)
    return [line for h in hparams if (line := regret_line(result.regret, h))]


def horizon_flag(spec: StudySpec, result: ValidateResult | None = None) -> str | None:
    """A warning when the lr tuned at the proxy may not be the target's because of training length: tune trains
    fewer steps than the transfer runs (with the drift per doubling of steps that a horizon sweep measured, or how
    to measure it), or a horizon sweep shows mup's optimum drifting past `validate.drift_threshold`. None: no
    reason to worry."""
    if spec.compare is not None:  # a compare study's budgets set every length
        return None
    tune, target = spec.steps_for("tune"), spec.train.steps
    drifts = result.horizon_drift if result is not None else []
    measured = "; ".join(f"at width {d.optima[0].width} mup's optimal lr drifts {d.mup_drift:+.2f}"
                         + (f" [{c[0]:+.2f}, {c[1]:+.2f}]" if (c := d.drift_ci.get("mup")) else "")
                         + " log2(lr) per doubling of steps" for d in drifts if d.optima)
    if tune < target:
        doublings = math.log2(target / tune)
        said = f"tune trains {tune} steps, the target {target} (train.steps; {doublings:.2g} doublings longer)"
        if measured:
            moved = ", ".join(f"{d.mup_drift * doublings:+.2f}" for d in drifts)
            return (f"{said}: {measured}, so the optimal lr at {target} steps lies ≈ {moved} log2(lr) from the "
                    f"optimum at the {tune} steps tune trained")
        how = ("the validate horizon sweep (validate.steps) will measure how far the lr optimum moves" if spec.validate_
               is not None and spec.validate_.horizons() else
               f"the lr optimum may move with training length: measure it with validate.steps: [{tune}, ..., {target}]")
        return f"{said}: {how}"
    failed = [d for d in drifts if not d.passed]
    if failed:
        return f"the lr optimum moves with training length ({measured}): tune at the target's training length"
    return None


def print_horizon(ctx: Context, result: ValidateResult | None, out: Out) -> None:
    """The summary's `horizon_flag` line, when there is one."""
    if flag := horizon_flag(ctx.spec, result):
        out.print(f"[yellow]horizon:[/] {escape(flag)}", soft_wrap=True)


def _drift_lines(drift: LRDrift, out: Out) -> None:
    """The optimal lr (or other swept hparam) per width under each parametrization and its drift per doubling."""
    h, axis = drift.hparam, drift.axis
    at = "" if axis == "width" else f" at width {drift.optima[0].width}" if drift.optima else ""
    column, key = {"width": "width", "horizon": "steps", "batch": "batch size"}.get(axis, axis), axis_column(axis)
    table = Table(title=f"{h} sweep (validate){at}: optimal {h} per {column}, interpolated in log {h}")
    for col in ("parametrization", column, f"best grid {h}", f"interpolated {h}", "eval loss"):
        table.add_column(col, justify="right")
    for o in sorted(drift.optima, key=lambda o: (o.parametrization != "mup", o.parametrization, getattr(o, key))):
        interp = f"{o.lr_interp:.3g}" if o.lr_interp is not None else "—"
        edge = " (grid edge)" if o.at_grid_edge else ""
        table.add_row(o.parametrization, str(getattr(o, key)), f"{o.lr:.3g}{edge}", interp, f"{o.eval_loss:.4f}")
    out.print(table)
    for param, value in drift.drift.items():
        ci = drift.drift_ci.get(param)
        interval = f" (95 % CI over seeds [{ci[0] + 0.0:+.2f}, {ci[1] + 0.0:+.2f}])" if ci else ""
        out.print(f"{h} drift{at}, {param}: {value + 0.0:+.2f} log2({h}) per doubling of {column}{interval}")
    out.print(f"[{'green' if drift.passed else 'red'}]{h} drift:[/] {drift.verdict}", soft_wrap=True)


def _depth_drift(v: ValidateSpec, depths: pd.DataFrame, out: Artifacts) -> LRDrift | None:
    """A depth sweep's figure and its drift per doubling of depth (completep judged, none beside it); None without
    `validate.depths`."""
    if not v.depths:
        return None
    analysis.plot_depth(depths, out.figure("depth"))
    return lr_drift(depths, threshold=v.drift_threshold, axis="depth")


def decay_timescales(spec: StudySpec, result: ValidateResult, table: pd.DataFrame | None) -> pd.DataFrame | None:
    """The λ sweep's optimum as AdamW timescales per (parametrization, width) (`analysis.optimum_timescales`, over
    the validate horizon); None without a `validate.weight_decays` sweep."""
    drift = result.hparam_drift.get(WEIGHT_DECAY)
    if drift is None or table is None:
        return None
    return optimum_timescales(without_depth_sweep(table), drift, spec.validate_horizon(), result.lr_drift)


def decay_words(spec: StudySpec) -> str:
    """What the λ sweep's timescales say and do not say, in one paragraph."""
    form = spec.train.weight_decay_form
    return (f"AdamW timescale at the λ sweep's optimum (train.weight_decay_form: {form}; T = "
            f"{spec.validate_horizon()} steps): τ* = 1/(η·λ*) iterations and τ*/T per width. A flat λ* (its drift "
            "above) keeps τ*/T the same at every width. Whether τ/T should stay fixed as T changes (Wang & "
            "Aitchison's rule, transfer.weight_decay: timescale) this sweep alone cannot show: compare τ*/T of "
            "sweeps at different validate.steps.")


def decay_section(spec: StudySpec, result: ValidateResult, table: pd.DataFrame | None) -> list[str]:
    """The report's paragraph and table of `decay_timescales` ([] without a λ sweep)."""
    frame = decay_timescales(spec, result, table)
    return [] if frame is None else [decay_words(spec), markdown_table(frame)]


def _decay_lines(ctx: Context, result: ValidateResult, out: Out) -> None:
    """The summary's timescale table of the λ sweep, when there is one."""
    frame = decay_timescales(ctx.spec, result, ctx.tables("validate"))
    if frame is None:
        return
    table = Table(title=f"AdamW timescale at λ* (T = {ctx.spec.validate_horizon()} steps, "
                        f"{ctx.spec.train.weight_decay_form} form)")
    for col in frame.columns:
        table.add_column(str(col), justify="right")
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{x:.3g}" if isinstance(x, float) else str(x) for x in row))
    out.print(table)


def _batch_metrics(result: ValidateResult) -> dict[str, float]:
    """A batch sweep's verdict metrics: `lr_batch_drift.<param>.w<width>`, and the regret of carrying the base
    batch's lr as `batch_regret[_pct].lr.<param>.w<width>.b<batch size>`."""
    drift = {f"lr_batch_drift.{p}.w{d.optima[0].width}": v for d in result.batch_drift if d.optima
             for p, v in d.drift.items()}
    return {**drift, **{f"{name}.{r.hparam}.{r.parametrization}.w{r.width}.b{r.batch_size}": value
                        for r in result.batch_regret
                        for name, value in (("batch_regret", r.regret), ("batch_regret_pct", r.regret_pct))
                        if value is not None}}


def _figure(hparam: str) -> str:
    return "mutransfer" if hparam == "lr" else f"mutransfer_{hparam}"


class Validate(Phase):
    name: ClassVar[str] = "validate"
    result: ClassVar[type[PhaseResult]] = ValidateResult
    how_to_add: ClassVar[str] = "add one with widths and lrs"
    told: ClassVar[int] = 1
    pictured: ClassVar[int] = 0  # the lr alignment: the headline
    headline: ClassVar[Mapping[str, tuple[str, str, str]]] = {"validate": (
        "lr alignment (the headline)", "Eval loss against the learning rate at each width, under each "
        "parametrization: under μP the optimum (★) should stay put as width grows.",
        "The lr-alignment figure heads this report.")}

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is None and spec.validate_ is not None

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        return validate_trials(ctx.spec, ctx.state.centre())

    def planned(self, spec: StudySpec) -> list[PlannedTrial]:
        return validate_trials(spec, spec.space.defaults())

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> ValidateResult:
        v = required(ctx.spec.validate_, Validate)
        forecast = judge_forecast(ctx, table)  # over every lr sweep: widths, horizons, batch sizes
        batch_drift, batch_regret = judge_batch(ctx.spec, batch_sweep(table), out)  # its rows kept out of the rest
        batch = {"batch_drift": batch_drift, "batch_regret": batch_regret}
        table = without_batch_sweep(table)
        depths, table = (depth_sweep(table), without_depth_sweep(table)) if not table.empty else (table, table)
        if not v.width_sweep():  # a depth or batch sweep alone
            return ValidateResult(depth_drift=_depth_drift(v, depths, out), **batch)
        horizon = None
        if v.horizons():  # the width sweep is the main horizon's rows; the horizon sweep is lr's at each width
            horizon, table = table, table[table["horizon"] == ctx.spec.validate_horizon()]
        drift, hparam_drift = None, {}
        if len(v.widths) > 1:  # one width: a horizon sweep alone
            for hparam in v.sweeps():
                analysis.plot_mutransfer(table, out.figure(_figure(hparam)), hparam)
            drift = lr_drift(table, threshold=v.drift_threshold)  # first: it names the fix for a sweep that diverged
            hparam_drift = {h: lr_drift(table, threshold=v.drift_threshold, hparam=h) for h in v.swept_hparams()}
        centre = {WEIGHT_DECAY: ctx.spec.train.weight_decay, **ctx.state.centre()}  # λ: searched, else fixed
        regret = transfer_regret(table, centre, regret_widths(ctx.spec), hparams=[h for h in v.sweeps() if centre[h]],
                                 parametrization=ctx.spec.model.parametrization, proxy_width=ctx.spec.tune.base_width)
        horizon_drift = []
        if horizon is not None:
            analysis.plot_horizon(horizon, out.figure("horizon"))
            horizon_drift = [lr_drift(horizon[horizon["width"] == w], threshold=v.drift_threshold, axis="horizon")
                             for w in v.widths]
        return ValidateResult(lr_drift=drift, hparam_drift=hparam_drift, regret=regret, horizon_drift=horizon_drift,
                              depth_drift=_depth_drift(v, depths, out), forecast=forecast, **batch)

    def figures(self, result: PhaseResult) -> dict[str, str]:
        assert isinstance(result, ValidateResult)
        return {**({"validate": "mutransfer"} if result.lr_drift else {}),
                **{f"validate ({h})": _figure(h) for h in result.hparam_drift},
                **({"validate (horizon)": "horizon"} if result.horizon_drift else {}),
                **({"validate (depth)": "depth"} if result.depth_drift else {}),
                **({"validate (batch size)": "batch"} if result.batch_drift else {})}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, ValidateResult)
        drifts = result.drifts()
        regret = {f"{name}.{r.hparam}.{r.parametrization}.w{r.width}": value for r in result.regret
                  for name, value in (("regret", r.regret), ("regret_pct", r.regret_pct)) if value is not None}
        horizon = {f"lr_horizon_drift.{p}.w{d.optima[0].width}": v for d in result.horizon_drift if d.optima
                   for p, v in d.drift.items()}
        tags = {f"{h}_drift_passed": str(bool(d.passed)).lower() for h, d in drifts.items()}
        if result.horizon_drift:
            tags["lr_horizon_drift_passed"] = str(all(d.passed for d in result.horizon_drift)).lower()
        depth = result.depth_drift
        if depth is not None:
            tags["lr_depth_drift_passed"] = str(depth.passed).lower()
        batch = _batch_metrics(result)
        if result.batch_drift:
            tags["lr_batch_drift_passed"] = str(all(d.passed for d in result.batch_drift)).lower()
        flag, batch_said = horizon_flag(spec, result), batch_flag(spec, result.batch_drift)
        return Verdict(metrics=[{"step": 0, **{f"{h}_drift.{p}": v for h, d in drifts.items()
                                                for p, v in d.drift.items()}, **regret, **horizon,
                                 **{f"lr_depth_drift.{p}": v for p, v in (depth.drift if depth else {}).items()},
                                 **batch, **forecast_metrics(result.forecast)}],
                       tags=tags,
                       sentence=" ".join([*(f"{h} drift: {d.verdict}." for h, d in drifts.items()),
                                          *regret_lines(result),
                                          *(f"lr horizon drift: {d.verdict}." for d in result.horizon_drift),
                                          *([f"lr depth drift: {depth.verdict}."] if depth else []),
                                          *([f"Horizon: {flag}."] if flag else []),
                                          *(f"lr batch drift: {d.verdict}." for d in result.batch_drift),
                                          *batch_lines(result.batch_drift, result.batch_regret),
                                          *([f"Batch: {batch_said}."] if batch_said else [])]))

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        # the horizon and batch drifts stay on the run page, and the other hparams' regret
        return [*verdict.shown(PASS, "tags", r"(?!lr_horizon_|lr_batch_)\w+_drift_passed"),
                *verdict.shown(DRIFTS, "metrics", r"(?!lr_depth_|lr_horizon_)\w+_drift\.\w+"),
                *verdict.shown(DRIFTS, "metrics", r"regret_pct\.lr\..+"),
                *verdict.shown(DRIFTS, "metrics", r"lr_depth_drift\.\w+")]

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        assert isinstance(result, ValidateResult)
        return [*([regret_section(result.regret)] if result.regret else []),
                *(drift_section(d) for d in result.all_drifts()),
                *decay_section(ctx.spec, result, tables.get("validate")),
                *batch_section(ctx.spec, result.batch_drift, result.batch_regret),
                *([forecast_section(result.forecast)] if result.forecast else [])]

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        validate = result if isinstance(result, ValidateResult) else None
        for drift in validate.all_drifts() if validate else ():
            _drift_lines(drift, out)
        for line in regret_lines(validate) if validate else ():
            out.print(f"[bold]{escape(line)}[/]", soft_wrap=True)
        if validate is not None:
            _decay_lines(ctx, validate, out)
        for line in batch_lines(validate.batch_drift, validate.batch_regret) if validate else ():
            out.print(f"[bold]{escape(line)}[/]", soft_wrap=True)
        print_forecast(validate.forecast if validate else None, out)
        if ctx.state.done("tune"):
            print_horizon(ctx, validate, out)
            print_batch_flag(ctx.spec, validate.batch_drift if validate else [], out)


PHASE = Validate()
