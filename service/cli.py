"""`ptctl`: the command line. Bad input ends with a one-line message naming the fix, never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console()


class UsageError(Exception):
    """A mistake in the command line or the files it names; printed without a traceback."""


def _parse_set(items: list[str]) -> dict:
    """`--set key=value` pairs; values parsed as YAML scalars (numbers, booleans, strings)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected key=value, e.g. --set n_iter=3")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise UsageError(f"--widths {text!r}: expected comma-separated integers, e.g. 32,64,128,256") from None
    if len(widths) < 2 or min(widths) < 1:
        raise UsageError(f"--widths {text!r}: give at least two positive widths, e.g. 32,64,128,256")
    return widths


# ---------------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from workers.data import DataConfig
    from workers.train import TrialConfig, train_trial

    hp = {"width": args.width, "base_width": args.base_width or args.width,
          "parametrization": args.parametrization, **_parse_set(args.set)}
    data = DataConfig(source=args.source, path=args.path, max_tokens=args.max_tokens, seq_len=args.seq_len)
    cfg = TrialConfig(model=args.model, model_hp=hp, data=data, steps=args.steps, lr=args.lr,
                      batch_size=args.batch_size, eval_every=args.eval_every, seed=args.seed, device=args.device)

    def progress(row: dict) -> None:
        if "eval_loss" in row:
            console.print(f"step {row['step']:>5}  train {row['train_loss']:.4f}  eval {row['eval_loss']:.4f}  "
                          f"{row['tokens_per_s']:,.0f} tok/s")

    result = train_trial(cfg, progress=progress)
    console.print(f"[bold]{result.status}[/]: eval loss {result.eval_loss:.4f} (best {result.best_eval_loss:.4f}), "
                  f"{result.params:,} params, {result.tokens:,} tokens in {result.wall_time_s:.1f} s "
                  f"({result.tokens_per_s:,.0f} tok/s) {result.message}")
    return 0 if result.status == "completed" else 1


def cmd_coord_check(args: argparse.Namespace) -> int:
    from analysis.coord import coord_slopes, coord_verdict, plot_coord
    from workers.coord_check import coord_data

    widths = _widths(args.widths)
    hp = {"paradigm": args.paradigm, **_parse_set(args.set)}
    df = coord_data(model=args.model, parametrization=args.parametrization, widths=widths, steps=args.steps,
                    lr=args.lr, seeds=args.seeds, model_hp=hp)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"coord_{args.model}_{args.parametrization}_{args.paradigm}"
    df.to_csv(out / f"{stem}.csv", index=False)
    plot_coord(df, out / f"{stem}.png")
    slopes = coord_slopes(df)
    judged = tuple(range(1, args.steps))
    # with r ∝ width the random initial part of the 1/r head logits vanishes as r^-1/2 (μP allows it)
    may_vanish = ("head_logits",) if args.paradigm == "rank" else ()
    verdict = coord_verdict(slopes, steps=judged, parametrization=args.parametrization, may_vanish=may_vanish)
    table = Table(title=f"log2-slope of rms vs width · {args.model} · {args.parametrization} · {args.paradigm}")
    table.add_column("activation")
    for step in sorted(slopes.step.unique()):
        table.add_column(f"step {step}", justify="right")
    bad = {(o.name, o.step) for o in verdict.offending}
    for name, rows in slopes.groupby("name"):
        cells = []
        for row in rows.sort_values("step").itertuples():
            cell = f"{row.slope:+.3f}"
            cells.append(f"[red]{cell}[/]" if (name, row.step) in bad else cell)
        table.add_row(name, *cells)
    console.print(table)
    console.print(f"[{'green' if verdict.passed else 'red'}]{verdict.verdict}[/]")
    console.print(f"wrote {out / (stem + '.csv')} and {out / (stem + '.png')}")
    return 0 if verdict.passed else 1


# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ptctl", description="Hyperparameter-transfer studies for PT (μP).")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one model directly (no Ray, no MLflow)")
    t.add_argument("--model", default="pt")
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
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="auto")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model hyperparameter")
    t.set_defaults(func=cmd_train)

    c = sub.add_parser("coord-check", help="μP coordinate check: activation scale vs width")
    c.add_argument("--model", default="pt")
    c.add_argument("--parametrization", choices=["mup", "standard"], default="mup")
    c.add_argument("--paradigm", choices=["channels", "rank"], default="channels")
    c.add_argument("--widths", default="32,64,128,256")
    c.add_argument("--steps", type=int, default=4, help="steps recorded; step 0 is init, 1.. are judged")
    c.add_argument("--lr", type=float, default=1e-2)
    c.add_argument("--seeds", type=int, default=3)
    c.add_argument("--out", default="coord_check")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model hyperparameter")
    c.set_defaults(func=cmd_coord_check)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
