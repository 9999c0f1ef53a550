"""transfer: the tune phase's winner, unchanged, trains at every transfer width and seed (μP makes it zero-shot);
the result is the eval loss per width."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd

import analysis
from analysis import transfer_table
from analysis.report import markdown_table
from studies.phases.base import LOSSES, SETUP, Artifacts, Context, Phase, PhaseResult, Verdict, required
from studies.plan import PlannedTrial
from studies.spec import StudySpec


class TransferResult(PhaseResult):
    widths: list[dict[str, Any]] = []  # `analysis.transfer_table`'s rows: width, eval_loss_mean, ...
    reused_from: str | None = None


def transfer_trials(spec: StudySpec, hparams: dict[str, float]) -> list[PlannedTrial]:
    """The winner, unchanged, at every transfer width and seed."""
    t = required(spec.transfer, Transfer)
    return [PlannedTrial(f"transfer-w{w}-s{s}", "transfer", w, s, dict(hparams)) for w in t.widths
            for s in range(t.seeds)]


class Transfer(Phase):
    name: ClassVar[str] = "transfer"
    result: ClassVar[type[PhaseResult]] = TransferResult
    reusable: ClassVar[tuple[str, ...]] = ("model", "data", "train", "space", "tune", "transfer")
    how_to_add: ClassVar[str] = "add one with widths"
    pictured: ClassVar[int] = 1

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is None and spec.transfer is not None

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        return transfer_trials(ctx.spec, ctx.state.centre())

    def planned(self, spec: StudySpec) -> list[PlannedTrial]:
        return transfer_trials(spec, spec.space.defaults())

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> TransferResult:
        summary = transfer_table(table)
        analysis.plot_transfer(pd.concat([ctx.tables("tune"), table], ignore_index=True), out.figure("transfer"))
        summary.to_csv(out.artifact("transfer_summary.csv"), index=False)
        return TransferResult(widths=summary.to_dict(orient="records"))

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {"transfer": "transfer"}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, TransferResult)
        t = required(spec.transfer, Transfer)
        widths = [r for r in result.widths if r.get("eval_loss_mean") == r.get("eval_loss_mean")]
        losses = ", ".join(f"{r['width']}: {r['eval_loss_mean']:.4f}" for r in widths)
        return Verdict({"base_width": spec.tune.base_width, "target_widths": ",".join(str(w) for w in t.widths)},
                       [{"step": int(r["width"]), "eval_loss": r["eval_loss_mean"]} for r in widths],
                       sentence=f"Zero-shot eval loss per width: {losses}.")

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        return [*verdict.shown(LOSSES, "metrics", "eval_loss"),
                *verdict.shown(SETUP, "params", "base_width|target_widths")]

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        return [markdown_table(transfer_table(tables["transfer"]))] if "transfer" in tables else []


PHASE = Transfer()
