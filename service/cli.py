"""`ptctl`: the command line. One command tree over two backends (`service/backends.py`): the study engine
in this process, or the API (`--server`, the `ptctl study submit|list|...` commands of `service/cli_remote.py`).

Bad input ends with one `error:` line naming the fix, a bug with its traceback (`service/terminal.py`).
Module level imports only argparse and rich; each command imports what it needs, so `ptctl --help` and
`ptctl report ID` load none of torch, Ray, MLflow, pandas, scipy, matplotlib or optuna.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from service.backends import Backend, LocalBackend, RemoteBackend
from service.plan import print_estimate
from service.terminal import console, invalid_input, load_spec, run_command, usage_error, validated_spec

if TYPE_CHECKING:
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec


def local() -> LocalBackend:
    return LocalBackend(console)


def backend(args: argparse.Namespace) -> Backend:
    """The API if the command is a client one or names `--server`, else the engine in this process."""
    if getattr(args, "remote", False) or getattr(args, "server", None):
        return RemoteBackend(args.server, console)
    return local()


def _parse_set(items: list[str]) -> dict[str, Any]:
    """`--set key=value` pairs; values parsed as YAML scalars (numbers, booleans, strings)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise usage_error(f"--set {item!r}: expected key=value, e.g. --set n_iter=3")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


class _Families:
    """The registered model families as argparse `choices` for `--model`'s help, read when it is printed (so building
    the parser imports no `studies`): the built-ins and the installed plugins' (`studies.family`). Every name passes
    argparse: the command's own look-up refuses an unknown one with the nearest name and a plugin's install hint."""

    def __iter__(self) -> Iterator[str]:
        from studies.family import family_names

        return iter(family_names())

    def __contains__(self, name: object) -> bool:
        return True


def _widths(text: str, flag: str = "--widths", least: int = 2, example: str = "32,64,128,256") -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise usage_error(f"{flag} {text!r}: expected comma-separated integers, e.g. {example}") from None
    if len(widths) < least or min(widths) < 1:
        what = "one positive width (a depth check varies depth at one width)" if least == 1 else \
            f"at least {least} positive values"
        raise usage_error(f"{flag} {text!r}: give {what}, e.g. {example}")
    return widths


# the flag that sets each field of `ptctl train`'s `TrialConfig`, so that an error names what the user typed
TRAIN_FLAGS = {"model": "--model", "steps": "--steps", "lr": "--lr", "batch_size": "--batch-size",
               "eval_every": "--eval-every", "seed": "--seed", "device": "--device", "data.source": "--source",
               "data.path": "--path", "data.max_tokens": "--max-tokens", "data.seq_len": "--seq-len",
               "data.streaming": "--streaming"}


def _model_flags(args: argparse.Namespace) -> dict[str, str]:
    """The flag that set each field of `ptctl train`'s model config (base_width: --width unless given), also as a
    spec's words name it (tune.base_width, model.arch.rank)."""
    from workers.models import family

    base = "--base-width" if args.base_width else "--width"
    arch = {f"model.arch.{k}": f"--set {k}=" for k in family(args.model).arch.model_fields}
    return {"width": "--width", "base_width": base, "tune.base_width": base, "parametrization": "--parametrization",
            **{k: f"--set {k}=" for k in _parse_set(args.set)}, **arch}


# ---------------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from studies.spec import TrialConfig
    from workers.model_check import check_model
    from workers.models import objective_of
    from workers.paths import data_dir
    from workers.train import train_trial

    hp = {"width": args.width, "base_width": args.base_width or args.width,
          "parametrization": args.parametrization, **_parse_set(args.set)}
    try:
        data = {"source": args.source, "path": args.path, "max_tokens": args.max_tokens, "seq_len": args.seq_len,
                "objective": objective_of(args.model), "streaming": args.streaming}
        given = {"model": args.model, "model_hp": hp, "data": data, "steps": args.steps, "lr": args.lr,
                 "batch_size": args.batch_size, "eval_every": args.eval_every, "seed": args.seed,
                 "device": args.device}
        cfg = TrialConfig.model_validate(given)
    except ValidationError as exc:  # the config's own checks of the values given on the command line
        raise invalid_input(exc, "the training run is not valid", TrialConfig, given, TRAIN_FLAGS) from None
    except ValueError as exc:
        raise usage_error(str(exc)) from None

    def progress(row: dict[str, Any]) -> None:
        if "eval_loss" in row:
            console.print(f"step {row['step']:>5}  train {row['train_loss']:.4f}  eval {row['eval_loss']:.4f}  "
                          f"{row['tokens_per_s']:,.0f} tok/s")

    from analysis.constants import TrialStatus

    try:
        check_model(cfg.model, cfg.model_hp, cfg.data.seq_len)  # the contract, before the first step
    except ValidationError as exc:  # the model config's checks of --width, --base-width and --set
        from workers.models import family

        raise invalid_input(exc, f"the {args.model} model is not valid", family(args.model).config, hp,
                            _model_flags(args)) from None
    log = data_dir() / "logs" / f"train-{cfg.model}.log"  # the model's own prints and warnings
    result = train_trial(cfg, progress=progress, log=log)
    console.print(f"[bold]{result.status}[/]: eval loss {result.eval_loss:.4f} (best {result.best_eval_loss:.4f}), "
                  f"{result.params:,} params, {result.tokens:,} tokens in {result.wall_time_s:.1f} s "
                  f"({result.tokens_per_s:,.0f} tok/s) {result.message}")
    if log.exists() and log.stat().st_size:
        console.print(f"the model's own output and warnings: {log}")
    return 0 if result.status == TrialStatus.COMPLETED else 1


def cmd_coord_check(args: argparse.Namespace) -> int:
    from analysis.coord import plot_coord
    from workers.coord_check import built, coord_check
    from workers.model_check import plugin_errors
    from workers.models import family
    from workers.paths import data_dir

    depths = _widths(args.depths, "--depths", example="2,4,8,16") if args.depths else None  # depth at one width
    widths = _widths(args.widths, least=1, example="64") if depths and args.widths else \
        _widths(args.widths or ("64" if depths else "32,64,128,256"), least=1 if depths else 2)
    paradigms = family(args.model).paradigms  # the ways the family may widen (PT: its head selection), if any
    if args.paradigm not in (None, *paradigms):
        raise usage_error(f"--paradigm {args.paradigm}: the {args.model} family's paradigms are {list(paradigms)}: "
                          "choose one or drop --paradigm")
    paradigm = args.paradigm or next(iter(paradigms), None)
    hp = {**({"paradigm": paradigm} if paradigm else {}), **_parse_set(args.set)}
    if depths:
        hp.setdefault("depth_parametrization", args.depth_parametrization or "completep")
    elif args.depth_parametrization:
        hp.setdefault("depth_parametrization", args.depth_parametrization)
    with plugin_errors(args.model, "running the coordinate check"):
        df, slopes, verdict, lr = coord_check(model=args.model, parametrization=args.parametrization,
                                              widths=widths, steps=args.steps, lr=args.lr, seeds=args.seeds,
                                              max_seeds=max(args.max_seeds, args.seeds), base_seed=args.seed,
                                              model_hp=hp, depths=depths)
    out = Path(args.out) if args.out else data_dir() / "coord_check"
    out.mkdir(parents=True, exist_ok=True)
    variant = f"{args.parametrization}_{paradigm}" if paradigm else args.parametrization
    if hp.get("optimizer", "adamw") != "adamw":
        variant += f"_{hp['optimizer']}"
    axis = "depth" if depths else "width"
    if depths:
        variant += f"_{hp['depth_parametrization']}_depth"
    stem = f"coord_{args.model}_{variant}"
    df.to_csv(out / f"{stem}.csv", index=False)
    plot_coord(df, out / f"{stem}.png", axis=axis)
    n_seeds = int(df["seed"].nunique())
    at = f" at width {widths[0]}" if depths else ""
    table = Table(title=f"log2-slope of rms vs {axis}{at} · {args.model} · {variant.replace('_', ' · ')} · "
                        f"lr {lr:.3g} · {n_seeds} seeds (mean ± 95% t-interval half-width)")
    table.add_column("activation")
    for step in sorted(slopes.step.unique()):
        table.add_column(f"step {step}", justify="right")
    bad = {(o.name, o.step) for o in verdict.offending}
    for name, rows in slopes.groupby("name"):
        cells = []
        for row in rows.sort_values("step").itertuples():
            cell = f"{row.slope:+.3f}" + (f" ±{(row.ci_high - row.ci_low) / 2:.2f}" if row.n_seeds > 1 else "")
            cells.append(f"[red]{cell}[/]" if (name, row.step) in bad else cell)
        table.add_row(name, *cells)
    console.print(table)
    if family(args.model).mup is not None:  # a mup model: each parameter's infshape at the widest width
        widest = built(args.model, args.parametrization, (max(widths),), {"base_width": min(widths), **hp})
        shapes = Table(title=f"mup infshapes at width {max(widths)}: size (base size) of each width dimension")
        shapes.add_column("parameter")
        shapes.add_column("infshape")
        for name, text in widest[max(widths)].infshapes().items():  # type: ignore[operator]
            shapes.add_row(name, text)
        console.print(shapes)
    console.print(f"[{'green' if verdict.passed else 'red'}]{verdict.verdict}[/]")
    console.print(f"wrote {out / (stem + '.csv')} and {out / (stem + '.png')}")
    return {"pass": 0, "fail": 1, "inconclusive": 3}[verdict.status]


# ---------------------------------------------------------------------------------------------
def cmd_laplacian(args: argparse.Namespace) -> int:
    import numpy as np

    from workers.laplacian import chain_laplacian, describe, knn_laplacian

    if args.embeddings:
        if not Path(args.embeddings).is_file():
            raise usage_error(f"no embeddings file {args.embeddings}: give an (N, F) matrix saved with numpy.save")
        lap = knn_laplacian(np.load(args.embeddings), args.dim, n_clusters=args.clusters, topk=args.topk,
                            eps=args.eps, sigma=args.sigma, p=args.power, seed=args.seed)
    else:
        lap = chain_laplacian(args.dim)
    table = Table(title=f"{'feature-kNN' if args.embeddings else 'chain'} Laplacian, {args.dim}×{args.dim}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for key, value in describe(lap).items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    if args.out:
        np.save(args.out, lap.numpy())
        console.print(f"wrote {args.out}: use it with model.arch.laplacian: file, laplacian_path: {args.out}")
    return 0


def _print_compare_plan(spec: StudySpec) -> None:
    """A compare study's runs: each family's width and parameters at every budget, its tune trials there, its
    final runs and their steps and FLOPs (at the spec's vocab_size cap: the corpus may have fewer tokens)."""
    from studies.budget import param_count
    from studies.phases.base import required
    from studies.phases.compare import Compare, compare_stages, compare_trials

    c, vocab = required(spec.compare, Compare), spec.data.vocab_size
    stages = compare_stages(spec, vocab)
    tuned: dict[tuple[str, float | None], int] = {(s.family, s.budget): s.spec.tune.num_trials for s in stages}
    finals: dict[tuple[str, float | None], list[PlannedTrial]] = {}
    for trial in compare_trials(spec, vocab, {s.name: {} for s in stages}):
        finals.setdefault((str(trial.family), trial.budget), []).append(trial)
    models = {spec.model.family: spec.model, **{b.model.family: b.model for b in c.baselines}}
    table = Table(title=f"plan of {spec.name}: every family at every budget (vocab {vocab:,})")
    for col in ("family", "role", "budget", "width", "params", "tune trials", "final runs", "steps", "FLOPs each"):
        table.add_column(col, justify="left" if col in ("family", "role") else "right")
    for (family, budget), runs in finals.items():
        run = runs[0]
        params = param_count(family, models[family].arch, run.width, vocab, spec.tune.base_width)
        table.add_row(family, str(run.role), f"{budget:,.0f}", str(run.width), f"{params:,}",
                      str(tuned.get((family, budget), 0)), str(len(runs)), f"{spec.steps_for('compare'):,}",
                      f"{run.train_flops:.3g}")
    console.print(table)
    proxy = next(s for s in stages if s.family == spec.model.family)
    console.print(f"{spec.model.family}: tuned once at width {proxy.width} ({proxy.spec.tune.num_trials} "
                  f"trials), carried zero-shot to every budget; every tune trial trains "
                  f"{proxy.spec.steps_for('tune'):,} steps")


def _print_plan(spec: StudySpec) -> None:
    """The planned trials, steps and FLOPs per phase, and their share of one training run at each target width."""
    from studies.cost import CHECK_PHASES, plan_cost, planned_runs
    from studies.family import get_family

    if spec.compare is not None:
        _print_compare_plan(spec)
        return
    if get_family(spec.model.family).forward_flops is None:
        table = Table(title=f"plan of {spec.name}")
        for col in ("phase", "trials", "widths", "steps"):
            table.add_column(col, justify="left" if col in ("phase", "widths") else "right")
        for phase, runs in planned_runs(spec).items():
            table.add_row(phase, str(len(runs)), ",".join(str(w) for w in sorted({w for w, _ in runs})),
                          f"{sum(s for _, s in runs):,.0f}")
        console.print(table)
        console.print(f"{spec.model.family} registers no FLOP counts (studies.family.Family.forward_flops): no FLOPs "
                      "or shares of a target run to show")
        _print_notes(spec)
        return
    plan = plan_cost(spec)
    widest = max(plan.targets, default=None)
    table = Table(title=f"plan of {spec.name}: training FLOPs from the shapes")
    for col in ("phase", "trials", "widths", "steps", "FLOPs", *([f"% of w{widest} run"] if widest else [])):
        table.add_column(col, justify="left" if col in ("phase", "widths") else "right")
    for p in plan.phases:
        share = [f"{100 * p.flops / plan.targets[widest]:.1f}"] if widest else []
        asha = "*" if p.phase == "tune" and spec.tune.asha.enabled else ""
        table.add_row(p.phase + asha, str(p.trials), ",".join(map(str, p.widths)), f"{p.steps:,.0f}",
                      f"{p.flops:.3g}", *share)
    console.print(table)
    if spec.tune.asha.enabled:
        console.print("* ASHA's expectation (1/η of the trials pass each rung); every trial in full: "
                      f"{plan.phases[0].max_flops:.3g} FLOPs")
    checks = " + ".join(p.phase for p in plan.phases if p.phase in CHECK_PHASES)
    for w, target in plan.targets.items():
        console.print(f"proxy cost = {100 * plan.share(w, ('tune',)):.1f} % of one target run at width {w} "
                      f"({target:.3g} FLOPs); {checks} = {100 * plan.share(w):.1f} %")
    if not plan.targets:
        console.print("no transfer widths: no target run to compare with")
    _print_notes(spec)


def _print_notes(spec: StudySpec) -> None:
    """What the plan says below its table: the horizon, the context, the batches, the runner."""
    from studies.arch import context_line

    _print_horizon(spec)
    console.print(f"context: {escape(context_line(spec.model.arch, spec.data.seq_len, spec.model.family))}",
                  soft_wrap=True)
    _print_batches(spec)
    _print_runner(spec)


def _print_horizon(spec: StudySpec) -> None:
    """Each sweep's warning on tune's setup (`studies.sweeps.flags`: training length, batch size); then what the lr
    forecast will be fitted on and for which target (`studies.phases.validate_forecast.forecast_plan_line`)."""
    from studies.phases.validate_forecast import forecast_plan_line
    from studies.sweeps import flags

    for label, flag in flags(spec, []):
        console.print(f"[yellow]{label}:[/] {escape(flag)}", soft_wrap=True)
    if line := forecast_plan_line(spec):
        console.print(f"forecast: {escape(line)}", soft_wrap=True)


def _print_runner(spec: StudySpec) -> None:
    """What the local runner does otherwise than Ray's (nothing is printed for Ray, the default)."""
    from workers.tracker import mlflow_installed

    if spec.resources.runner == "local":
        asha = " (tune.asha is Ray Tune's: every tune trial trains its full budget)" if spec.tune.asha.enabled else ""
        mlflow = "records the runs" if mlflow_installed() else "is not installed: no runs are recorded"
        console.print(f"runner: local: the trials train in this process, one trial or batch at a time, no Ray; no "
                      f"early stopping{asha}; MLflow {mlflow}", soft_wrap=True)


def _print_batches(spec: StudySpec) -> None:
    """How the grid phases' trials are packed into processes (`resources.batch_members`, `studies.members`)."""
    from studies.cost import planned_trials
    from studies.members import batches, solo_note

    k, note = spec.resources.batch_members, solo_note(spec)
    if note:
        console.print(f"batches: {note}", soft_wrap=True)
        return
    if k == "auto":
        console.print("batches: resources.batch_members is auto: each trial alone on CPU; on GPUs as many members "
                      "per batch as a GPU's memory holds, decided when each phase starts")
        return
    for phase, trials in planned_trials(spec).items():
        sizes = [len(group) for group in batches(spec, trials, int(k))]
        packed = ", ".join(str(n) for n in sizes)
        console.print(f"batches: {phase}: {len(trials)} trials in {len(sizes)} process"
                      f"{'es' if len(sizes) > 1 else ''} ({packed} members)")


def _transfer_spec(args: argparse.Namespace) -> StudySpec:
    """The spec file as tune at --from-width → transfer to --to (→ verify at the widest target with --verify)."""
    data = load_spec(args.spec).as_dict()
    data["tune"] = {**(data.get("tune") or {}), "base_width": args.from_width,
                    **({"num_trials": args.trials} if args.trials is not None else {})}
    data["transfer"] = {**(data.get("transfer") or {}), "widths": sorted(args.to)}
    data["validate"] = None  # tune → transfer (→ verify) only; `ptctl study run` runs a spec's lr sweep
    if args.runner is not None:
        data["resources"] = {**(data.get("resources") or {}), "runner": args.runner}
    if not args.verify:
        data["verify"] = None
    elif data.get("verify") and data["verify"].get("width") not in (None, *args.to):
        data["verify"] = {**data["verify"], "width": None}  # verify at the widest target
    flags = {"tune.base_width": "--from-width", "transfer.widths": "--to",
             **({"tune.num_trials": "--trials"} if args.trials is not None else {})}
    return validated_spec(data, f"{args.spec} with these flags is not a valid study", flags)


def cmd_transfer(args: argparse.Namespace) -> int:
    spec = _transfer_spec(args)
    if args.dry_run:
        _print_plan(spec)
        if args.probe:
            print_estimate(console, spec)
        return 0
    return backend(args).run(spec)


VERIFY_FLAGS = {"n_samples": "--samples", "delta": "--delta", "width": "--width", "sampling": "--sampling",
                "centre_seeds": "--centre-seeds", "tolerance": "--tolerance"}  # `ptctl verify`: verify's fields


def cmd_verify(args: argparse.Namespace) -> int:
    """Run the local-optimality check around a finished study's centre (its tune and transfer are reused)."""
    spec = load_spec(str(local().file(args.study, "spec.yaml")))
    overrides = {k: v for k, v in {"n_samples": args.samples, "delta": args.delta, "width": args.width,
                                   "sampling": args.sampling, "centre_seeds": args.centre_seeds}.items()
                 if v is not None}
    if args.tolerance is not None:  # a number's text becomes a float in validation; other text must be a name
        overrides["tolerance"] = args.tolerance
    data = spec.as_dict()
    data["verify"] = {**(data["verify"] or {}), **overrides}
    flags = {f"verify.{k}": VERIFY_FLAGS[k] for k in overrides}
    return local().run(validated_spec(data, f"study {args.study}'s spec with these flags is not valid", flags))



def cmd_study_run(args: argparse.Namespace) -> int:
    spec = load_spec(args.file)
    if args.runner is not None:
        spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"runner": args.runner})})
    return local().run(spec, args.study_id)


def cmd_study_plan(args: argparse.Namespace) -> int:
    spec = load_spec(args.file)
    _print_plan(spec)
    if args.probe:
        print_estimate(console, spec)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """A finished study's Markdown report, from the data directory (`ptctl report`) or the API (`--server`,
    `ptctl study report`)."""
    text = backend(args).report(args.study)
    if args.render:
        from rich.markdown import Markdown

        console.print(Markdown(text))
    else:
        console.print(text)
    return 0


FORECAST_LOCAL = ("ptctl forecast reads the study's folder on this machine ($PTCTL_DATA_DIR/studies/ID), not the "
                  "API, which has no forecast endpoint")


def cmd_forecast(args: argparse.Namespace) -> int:
    """The optimal lr a finished study's validate sweeps forecast for a target of any width, steps and batch size,
    before that target trains (`studies.phases.validate_forecast.forecast_at`); local only (`FORECAST_LOCAL`)."""
    if args.server:
        raise usage_error(f"--server {args.server}: {FORECAST_LOCAL}: run it on the machine that holds the study's "
                          "folder (the server's, for a study submitted to it)")
    import pandas as pd

    from analysis.forecast import forecast_line
    from studies.phases.validate_forecast import forecast_at, forecast_widths, target_width
    from workers.folder import StudyFolder

    spec = load_spec(str(local().file(args.study, "spec.yaml")))
    if not forecast_widths(spec):
        raise usage_error(f"study {args.study} has no lr sweeps at two or more widths under mup to forecast from: "
                          "run a study whose validate section has 2–4 widths and 'mup' among its parametrizations")
    for flag, value in (("--width", args.width), ("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise usage_error(f"{flag} {value}: give a positive integer")
    state = StudyFolder(args.study).read_state()
    centre = state.centre().get("lr") if state is not None and state.done("tune") else None
    table = pd.read_csv(local().file(args.study, "validate_trials.csv"))
    try:
        made = forecast_at(spec, table, centre, args.width or target_width(spec) or spec.tune.base_width,
                           args.steps or spec.train.steps, args.batch_size or spec.train.batch_size)
    except ValueError as exc:
        raise usage_error(f"no forecast from study {args.study}: {exc}") from None
    console.print(forecast_line(made), soft_wrap=True)
    if made.note:
        console.print(f"note: {made.note}", soft_wrap=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ptctl", description="Hyperparameter-transfer studies for PT (μP).")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one model directly (no Ray, no MLflow)")
    t.add_argument("--model", default="pt", choices=_Families(), metavar="FAMILY",
                   help="the model family: one of %(choices)s (installed plugins' included)")
    t.add_argument("--width", type=int, default=64)
    t.add_argument("--base-width", type=int, default=None, help="μP base width (default: --width)")
    t.add_argument("--parametrization", choices=["mup", "standard"], default="mup")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--lr", type=float, default=1e-2)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--eval-every", type=int, default=50)
    t.add_argument("--seq-len", type=int, default=64)
    t.add_argument("--source", default="shakespeare", help="shakespeare | text | jsonl | hf")
    t.add_argument("--path", default=None, help="file, folder, glob or dataset name for --source")
    t.add_argument("--max-tokens", type=int, default=None)
    t.add_argument("--streaming", action="store_true", help="jsonl: stream the files instead of loading them")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="auto")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model hyperparameter")
    t.set_defaults(func=cmd_train)

    f = sub.add_parser("forecast", help="the optimal lr a finished study's validate sweeps forecast for a target "
                       "(local only: reads the study's folder here, not the API)",
                       description=f"The optimal lr a finished study's validate sweeps forecast for a target; "
                       f"{FORECAST_LOCAL}.")
    f.add_argument("study", help="a finished study's id (its validate phase swept lr at 2–4 widths under mup)")
    f.add_argument("--width", type=int, default=None, help="the target's width (default: the study's target)")
    f.add_argument("--steps", type=int, default=None, help="the target's training steps (default: train.steps)")
    f.add_argument("--batch-size", type=int, default=None, help="the target's batch size (default: train.batch_size)")
    f.add_argument("--server", default=None, help="refused: the API has no forecast (run it where the folder is)")
    f.set_defaults(func=cmd_forecast)

    c = sub.add_parser("coord-check", help="μP coordinate check: activation scale vs width")
    c.add_argument("--model", default="pt", choices=_Families(), metavar="FAMILY",
                   help="the model family: one of %(choices)s (installed plugins' included)")
    c.add_argument("--parametrization", choices=["mup", "standard"], default="mup")
    c.add_argument("--paradigm", default=None, help="how a family with a choice widens (pt: channels | rank); "
                   "default: its first")
    c.add_argument("--widths", default=None, help="default 32,64,128,256; with --depths one width, default 64")
    c.add_argument("--depths", default=None, help="e.g. 2,4,8,16: vary depth (n_layers; UT: n_steps) at one width "
                   "and judge the depth parametrization per doubling of depth")
    c.add_argument("--depth-parametrization", choices=["none", "completep"], default=None,
                   help="model.arch.depth_parametrization (default with --depths: completep; base_depth: the "
                        "smallest depth)")
    c.add_argument("--steps", type=int, default=4, help="steps recorded; step 0 is init, 1.. are judged")
    c.add_argument("--lr", type=float, default=None,
                   help="base lr (default 0.32 / base width: 1e-2 at widths from 32, 2.5e-3 from 128)")
    c.add_argument("--seeds", type=int, default=4, help="seeds per batch; batches are added while inconclusive")
    c.add_argument("--max-seeds", type=int, default=16, help="stop adding seeds here (verdict: inconclusive)")
    c.add_argument("--seed", type=int, default=0, help="first seed (seeds are seed, seed+1, …)")
    c.add_argument("--out", default=None, help="folder for the CSV and PNG (default: $PTCTL_DATA_DIR/coord_check, "
                   "i.e. ~/.ptctl/coord_check)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="model hyperparameter, or the optimiser's: optimizer=muon, muon_adjust_lr=original, …")
    c.set_defaults(func=cmd_coord_check)

    lp = sub.add_parser("laplacian", help="build TauGPT's feature Laplacian (chain, or feature-kNN of embeddings)")
    lp.add_argument("embeddings", nargs="?", help="an (N, F) .npy item-embedding matrix; omitted: the chain")
    lp.add_argument("--dim", type=int, required=True, help="the model's head_dim")
    lp.add_argument("--out", help="save the (dim, dim) matrix here (.npy)")
    lp.add_argument("--clusters", type=int, default=179, help="k-means centroids the features are described by")
    lp.add_argument("--topk", type=int, default=15, help="cosine-nearest candidate features per feature")
    lp.add_argument("--eps", type=float, default=1.31, help="largest kept cosine distance")
    lp.add_argument("--sigma", type=float, default=0.535, help="edge weight 1 / (1 + (d/σ)^p)")
    lp.add_argument("--power", type=float, default=1.8, help="p of the edge weight")
    lp.add_argument("--seed", type=int, default=0)
    lp.set_defaults(func=cmd_laplacian)

    tr = sub.add_parser("transfer", help="tune at --from-width, train --to widths zero-shot, optionally verify")
    tr.add_argument("--from-width", type=int, required=True, help="the base width the hparams are tuned at")
    tr.add_argument("--to", type=int, action="append", required=True, help="a target width (repeatable)")
    tr.add_argument("--spec", default=str(Path(__file__).parents[1] / "studies" / "catalog" / "cpu_demo.yaml"),
                    help="study spec YAML (default: the CPU demo)")
    tr.add_argument("--trials", type=int, default=None, help="tune trials (default: the spec's)")
    tr.add_argument("--runner", choices=["ray", "local"], default=None, help="ray: Ray Tune (the default); local: in "
                    "this process, no Ray (resources.runner; default: the spec's)")
    tr.add_argument("--verify", action="store_true", help="run the local-optimality check at the widest target")
    tr.add_argument("--server", default=None, help="submit the study to this ptctl API and follow it live "
                    "(token: $PTCTL_TOKEN) instead of running it here")
    tr.add_argument("--dry-run", action="store_true", help="print the planned trials, FLOPs and the proxy's cost "
                    "share of one target run, and the wall time from a few timed steps of each trial shape; train "
                    "nothing")
    tr.add_argument("--no-probe", dest="probe", action="store_false", help="with --dry-run: FLOPs only, no timed "
                    "steps (nothing imports torch)")
    tr.set_defaults(func=cmd_transfer)

    st = sub.add_parser("study", help="studies").add_subparsers(dest="study_command", required=True)
    run = st.add_parser("run", help="run (or resume) a study from a spec file")
    run.add_argument("file")
    run.add_argument("--study-id", default=None, help="resume this study id (default: name + spec hash)")
    run.add_argument("--runner", choices=["ray", "local"], default=None, help="ray: Ray Tune; local: in this "
                     "process, no Ray (resources.runner; default: the spec's)")
    run.set_defaults(func=cmd_study_run)
    pl = st.add_parser("plan", help="planned trials and FLOPs per phase, the proxy's cost share, and the wall time "
                       "from a few timed steps of each trial shape; trains nothing")
    pl.add_argument("file")
    pl.add_argument("--no-probe", dest="probe", action="store_false", help="FLOPs only, no timed steps (nothing "
                    "imports torch)")
    pl.set_defaults(func=cmd_study_plan)
    from service.cli_remote import add_commands  # study submit|list|show|trials|report|cancel|resume, serve

    add_commands(sub, st, cmd_report)

    ve = sub.add_parser("verify", help="the 62-sample-style check around a finished study's transferred centre")
    ve.add_argument("study", help="a finished study id (its tune and transfer phases are reused)")
    ve.add_argument("--samples", type=int, default=None, help="N (default: ceil(ln α / ln(1-p)) = 59)")
    ve.add_argument("--delta", type=float, default=None, help="half-width δ of the neighbourhood, in (0, 1)")
    ve.add_argument("--width", type=int, default=None, help="verify width (default: the widest transfer width)")
    ve.add_argument("--sampling", choices=["linear", "log"], default=None)
    ve.add_argument("--centre-seeds", type=int, default=None, help="seeds of the centre (seed noise)")
    ve.add_argument("--tolerance", default=None,
                    help="'seed_spread', 'seed_noise' or a relative tolerance such as 0.004")
    ve.set_defaults(func=cmd_verify)

    rep = sub.add_parser("report", help="print a finished study's Markdown report")
    rep.add_argument("study", help="study id")
    rep.add_argument("--render", action="store_true", help="render the Markdown in the terminal")
    rep.add_argument("--server", default=None, help="read it from this ptctl API instead of the data directory")
    rep.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_command(args.func, args, console)


if __name__ == "__main__":
    sys.exit(main())
