"""Interleaved rounds of three or more sides: `make bench` scenarios run in turn from each side
(a checkout, with environment variables of its own), the order rotating every round.

bench/pairs.py compares two sides; two pair runs made one after the other (A against B, then A
against C) each carry their own stretch of the machine's drift, and on a noisy machine their
medians can differ by more than the effect looked for. Here every side runs in every round, so
each ratio against the first side comes from the same minutes. Each round's ratio is taken
against the first side's run of that round (for durations the first side's value over the
side's, so above 1 is better in every row).

Usage: python bench/rotation.py --side NAME=DIR[,VAR=VALUE...] --side ... [--rounds 9]
           [--only enqueue_single_8_clients,pickup_idle_worker] [--jobs N]
           [--bench-from DIR] [--out bench-results/rotation.json]
e.g. `--side before=<06c2642 tree> --side after=<tree> --side declared=<tree>,BENCH_DECLARED=1`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pairs import metrics, ratio, run_once, spread


def side(text: str) -> tuple[str, Path, dict[str, str]]:
    """`NAME=DIR[,VAR=VALUE...]` as (name, checkout, environment)."""
    name, _, rest = text.partition("=")
    tree, *env = rest.split(",")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"--side wants NAME=DIR[,VAR=VALUE...], not {text!r}")
    return name, Path(tree), dict(item.split("=", 1) for item in env)


def rounds(sides: list[tuple[str, Path, dict[str, str]]], count: int, only: str,
           jobs: int, bench: Path | None = None) -> list[dict[str, dict[str, tuple[float, bool]]]]:
    """`count` rounds, each running every side once, the order rotated by one each round."""
    out = []
    first = sides[0][0]
    for n in range(count):
        shift = n % len(sides)
        turn = sides[shift:] + sides[:shift]
        runs = {name: metrics(run_once(tree, only, jobs, bench, env)) for name, tree, env in turn}
        out.append(runs)
        print(f"round {n + 1}: " + json.dumps({
            name: {k: round(ratio(runs[first][k][0], v, higher), 3)
                   for k, (v, higher) in runs[name].items() if k in runs[first]}
            for name, _, _ in sides[1:]}), flush=True)
    return out


def summary(sides: list[str], done: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side after the first, per metric: the median ratio over the rounds, min and max."""
    first = sides[0]
    out: dict[str, Any] = {}
    for name in sides[1:]:
        for metric, (_v, higher) in done[0][name].items():
            if any(metric not in r[first] for r in done):
                continue
            out.setdefault(name, {})[metric] = spread(
                [ratio(r[first][metric][0], r[name][metric][0], higher) for r in done])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=side, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", default="enqueue_single_8_clients,pickup_idle_worker")
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/rotation.json"))
    parser.add_argument("--bench-from", type=Path, default=None,
                        help="a checkout whose bench/ every side runs (default: each its own)")
    args = parser.parse_args()
    if len(args.side) < 2:
        parser.error("at least two --side")
    names = [name for name, _, _ in args.side]
    done = rounds(args.side, args.rounds, args.only, args.jobs, args.bench_from)
    result = summary(names, done)
    for name, by_metric in result.items():
        for metric, s in by_metric.items():
            print(f"{name} / {names[0]}  {metric:34s} ratio median {s['median_ratio']:.3f} "
                  f"(min {s['min']:.3f}, max {s['max']:.3f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sides": names, "rounds": done, "summary": result},
                                   indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
