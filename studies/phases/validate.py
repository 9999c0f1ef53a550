"""validate: the μTransfer evidence. lr (and, along width, each of `validate.hparams` and AdamW's λ) swept along
each axis the spec names — width, training steps, depth, batch size, context: one sweep per file,
`studies.sweeps.SWEEPS` — the other hparams at the centre; each sweep's drift per doubling of its axis is passed
against `validate.drift_threshold`, and the regrets say what carrying the transferred (or base) values costs. With
two or more widths under mup, `analysis.forecast` fits the optimal lr over every lr sweep and forecasts it at the
target, scored on held-out points beside Step Law (`forecast`, `studies.phases.validate_forecast`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd
from pydantic import model_validator
from rich.markup import escape
from rich.table import Table

from analysis import LRDrift, Regret
from analysis.forecast import Forecast
from analysis.report import drift_section, forecast_section
from studies.phases.base import Artifacts, Context, Out, Phase, PhaseResult, Verdict, required
from studies.phases.validate_forecast import forecast_metrics, judge_forecast, print_forecast
from studies.plan import PlannedTrial
from studies.spec import StudySpec
from studies.sweeps import SWEEPS, flags, with_sweep

LEGACY = {"lr_drift": "drifts", "hparam_drift": "drifts", "horizon_drift": "drifts", "depth_drift": "drifts",
          "batch_drift": "drifts", "regret": "regrets", "batch_regret": "regrets"}
"""A record from before the sweeps (state.json of an older study): each field, in the order the sweeps now list
them, and the list it joins."""


class ValidateResult(PhaseResult):
    drifts: list[LRDrift] = []  # every sweep's drifts along its axis (`LRDrift.axis`), in `SWEEPS` order
    regrets: list[Regret] = []  # every sweep's regrets (`Regret.axis`: None along width)
    forecast: Forecast | None = None  # the target's optimal lr fitted over mup's lr sweeps (2+ widths)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.keys() & LEGACY.keys():
            return data
        data = dict(data)
        for old, new in LEGACY.items():
            value = data.pop(old, None)
            values = list(value.values()) if old == "hparam_drift" and value else value if isinstance(value, list) \
                else [value] if value is not None else []
            data[new] = [*data.get(new, []), *values]
        return data

    def drift(self, axis: str = "width", hparam: str = "lr") -> LRDrift | None:
        """The (first) drift of `hparam` along `axis`; None when the study measured none."""
        return next((d for d in self.drifts if d.axis == axis and d.hparam == hparam), None)

    def along(self, sweep: str) -> tuple[list[LRDrift], list[Regret]]:
        """Its drifts and regrets along one sweep's axis."""
        return ([d for d in self.drifts if d.axis == sweep],
                [r for r in self.regrets if (r.axis or "width") == sweep])


def validate_trials(spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
    """Every sweep's trials (`Sweep.trials`), in `SWEEPS` order."""
    v = required(spec.validate_, Validate)
    return [t for sweep in v.present() for t in sweep.trials(spec, centre)]


def _drift_lines(drift: LRDrift, out: Out) -> None:
    """The optimal lr (or other swept hparam) per value of the axis under each parametrization and its drift per
    doubling."""
    h, axis = drift.hparam, drift.axis
    at = "" if axis == "width" else f" at width {drift.width}" if drift.optima else ""
    column = SWEEPS[axis].header
    table = Table(title=f"{h} sweep (validate){at}: optimal {h} per {column}, interpolated in log {h}")
    for col in ("parametrization", column, f"best grid {h}", f"interpolated {h}", "eval loss"):
        table.add_column(col, justify="right")
    for o in sorted(drift.optima, key=lambda o: (o.parametrization != "mup", o.parametrization, o.along(axis))):
        interp = f"{o.lr_interp:.3g}" if o.lr_interp is not None else "—"
        edge = " (grid edge)" if o.at_grid_edge else ""
        table.add_row(o.parametrization, str(o.along(axis)), f"{o.lr:.3g}{edge}", interp, f"{o.eval_loss:.4f}")
    out.print(table)
    for param, value in drift.drift.items():
        ci = drift.drift_ci.get(param)
        interval = f" (95 % CI over seeds [{ci[0] + 0.0:+.2f}, {ci[1] + 0.0:+.2f}])" if ci else ""
        out.print(f"{h} drift{at}, {param}: {value + 0.0:+.2f} log2({h}) per doubling of {column}{interval}")
    out.print(f"[{'green' if drift.passed else 'red'}]{h} drift:[/] {drift.verdict}", soft_wrap=True)


def print_flags(spec: StudySpec, drifts: list[LRDrift], out: Out) -> None:
    """The sweeps' flags on tune's setup (`studies.sweeps.flags`), one line each."""
    for label, flag in flags(spec, drifts):
        out.print(f"[yellow]{label}:[/] {escape(flag)}", soft_wrap=True)


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
        table = with_sweep(ctx.spec, table)
        forecast = judge_forecast(ctx, table[table["sweep"].isin([s.name for s in SWEEPS.values() if s.forecast])])
        drifts, regrets = [], []
        for sweep in v.present():
            judged = sweep.judge(ctx.spec, sweep.rows(table), ctx.state.centre(), out)
            drifts += judged.drifts
            regrets += judged.regrets
        return ValidateResult(drifts=drifts, regrets=regrets, forecast=forecast)

    def figures(self, result: PhaseResult) -> dict[str, str]:
        assert isinstance(result, ValidateResult)
        return {k: v for s in SWEEPS.values() for k, v in s.figures(result.along(s.name)[0]).items()}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, ValidateResult)
        metrics, tags, sentence = {}, {}, []
        for s in SWEEPS.values():
            drifts, regrets = result.along(s.name)
            metrics.update(s.metrics(drifts, regrets))
            tags.update(s.tags(drifts))
            sentence += s.sentence(spec, drifts, regrets)
        return Verdict(metrics=[{"step": 0, **metrics, **forecast_metrics(result.forecast)}], tags=tags,
                       sentence=" ".join(sentence))

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        return [c for s in SWEEPS.values() for c in s.columns(spec, verdict)]

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        assert isinstance(result, ValidateResult)
        table = tables.get("validate")
        table = with_sweep(ctx.spec, table) if table is not None else None
        parts = [s.section(ctx.spec, *result.along(s.name), table) for s in SWEEPS.values()]
        drifts = [drift_section(d, SWEEPS[d.axis].axis.column, SWEEPS[d.axis].header) for d in result.drifts]
        return [*(p for before, _ in parts for p in before), *drifts,
                *(p for _, after in parts for p in after),
                *([forecast_section(result.forecast)] if result.forecast else [])]

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        validate = result if isinstance(result, ValidateResult) else None
        drifts = validate.drifts if validate else []
        for drift in drifts:
            _drift_lines(drift, out)
        if validate is not None:
            table = ctx.tables("validate")
            table = with_sweep(ctx.spec, table) if table is not None else None
            for s in SWEEPS.values():
                lines, extra = s.summary(ctx.spec, *validate.along(s.name), table)
                for line in lines:
                    out.print(f"[bold]{escape(line)}[/]", soft_wrap=True)
                if extra is not None:
                    out.print(extra)
        print_forecast(validate.forecast if validate else None, out)
        if ctx.state.done("tune"):
            print_flags(ctx.spec, drifts, out)


PHASE = Validate()
