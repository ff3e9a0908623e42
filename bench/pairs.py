"""Interleaved before/after pairs: `make bench` scenarios run alternately from two checkouts.

A change is judged by the ratio after/before within each pair, never against a figure taken on
another day: the machine's speed drifts, and the pair's two runs share whatever it was doing.
Each checkout runs its own bench/run.py with its own virtualenv (`<tree>/.venv`), one
repetition per run, the two orders alternating so neither side always runs second.

Usage: python bench/pairs.py --before DIR --after DIR [--pairs 7]
           [--only drain_4_workers,enqueue_single_8_clients,pickup_idle_worker] [--jobs N]
           [--bench-from DIR] [--after-env NAME=VALUE] [--out bench-results/pairs.json]
`--bench-from` runs one checkout's bench/ with both sides' code, so a scenario newer than the
older side can still measure it. Prints, per metric, each pair's ratio and the median with
min-max. For durations (ms, s) the ratio is before/after, so above 1 is better in every row,
the pairs' lines included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_ONLY = "drain_4_workers,enqueue_single_8_clients,pickup_idle_worker"


def run_once(tree: Path, only: str, jobs: int, bench: Path | None,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """One repetition of the scenarios with `tree`'s code (its virtualenv); the benchmark's
    own scripts are `bench`'s when given (to run a new scenario against older code); `env`
    added to the environment."""
    script = (bench or tree) / "bench" / "run.py"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([str(tree / ".venv" / "bin" / "python"), str(script), "--repeat", "1",
                        "--no-peers", "--only", only, "--jobs", str(jobs), "--out", out.name],
                       cwd=tree, check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, **(env or {})})
        return json.loads(Path(out.name).read_text())["results"]


def metrics(results: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """(value, higher_is_better) per metric: throughputs, pickup p50/p99 and the chain's
    handoff p50 (alone and over its run's idle pickup)."""
    out: dict[str, tuple[float, bool]] = {}
    for name, value in results.items():
        if isinstance(value, dict) and "median" in value:
            # A duration (`..._s`, `..._ms`) is better lower; every other median is a rate.
            out[name] = (float(value["median"]), not name.endswith(("_s", "_ms")))
        elif isinstance(value, dict):  # by case (the sweep), or by case and system
            out.update(_nested(name, value))
        elif name == "pickup_idle_worker":
            (first,) = value
            for way, q in first.items():
                out[f"pickup {way} p50"] = (float(q["p50"]), False)
                out[f"pickup {way} p99"] = (float(q["p99"]), False)
        elif name == "enqueue_p99_beside_workflow_lists":
            (first,) = value
            out["enqueue p99 beside lists"] = (float(first["listing_ms"]["p99"]), False)
            out["enqueue p99 beside lists / quiet"] = (float(first["p99_ratio"]), False)
            out["lists/s"] = (float(first["lists_per_s"]), True)
        elif name == "library_enqueue":
            (first,) = value
            for key, figure in first.items():  # jobs/s better higher, CPU (_us) lower
                out[f"library {key}"] = (float(figure), not key.endswith("_us"))
        elif name == "workflow_chain_100_handoff":
            (first,) = value
            out["chain handoff p50"] = (float(first["handoff_ms"]["p50"]), False)
            out["chain handoff p50 / idle pickup p50"] = (
                float(first["p50_handoff_over_pickup"]), False)
    return out


def _nested(prefix: str, value: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """The medians of a scenario that reports by case (and by system in a case): throughputs,
    and CPU per job (under a `..._cpu_ms` entry, better lower)."""
    out: dict[str, tuple[float, bool]] = {}
    for key, item in value.items():
        if isinstance(item, dict) and "median" in item:
            lower = f"{prefix} {key}".endswith(("_s", "_ms")) or prefix.endswith("_cpu_ms")
            out[f"{prefix} {key}"] = (float(item["median"]), not lower)
        elif isinstance(item, dict):
            out.update(_nested(f"{prefix} {key}", item))
    return out


def ratio(before: float, after: float, higher_is_better: bool) -> float:
    return after / before if higher_is_better else before / after


def spread(ratios: list[float]) -> dict[str, Any]:
    """The pairs' (or rounds') ratios of one metric: their median, min, max and the ratios."""
    return {"median_ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "ratios": ratios}


def compared(ratios: list[float], before: Iterable[float],
             after: Iterable[float]) -> dict[str, Any]:
    """One metric over the pairs: its ratios' spread and the median of each side's values."""
    return {**spread(ratios), "before_median": statistics.median(before),
            "after_median": statistics.median(after)}


def alternating(n: int) -> tuple[str, str]:
    """The order of pair `n`'s two runs: it alternates, so neither side always runs second."""
    return ("before", "after") if n % 2 == 0 else ("after", "before")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--only", default=DEFAULT_ONLY)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/pairs.json"))
    parser.add_argument("--bench-from", type=Path, default=None,
                        help="a checkout whose bench/ both sides run (default: each its own)")
    parser.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set for the after side's runs only (BENCH_DECLARED=1: declared "
                             "types against undeclared, --before and --after one checkout)")
    args = parser.parse_args()
    after_env = dict(item.split("=", 1) for item in args.after_env)
    pairs: list[dict[str, Any]] = []
    for n in range(args.pairs):
        runs = {side: metrics(run_once(getattr(args, side), args.only, args.jobs,
                                       args.bench_from, after_env if side == "after" else None))
                for side in alternating(n)}
        pairs.append(runs)
        print(f"pair {n + 1}: " + json.dumps({
            k: round(ratio(runs["before"][k][0], after, higher), 3)
            for k, (after, higher) in runs["after"].items() if k in runs["before"]}), flush=True)
    summary = {}
    # A metric one side does not report (CPU by component, newer than the before tree) has no
    # ratio: only the metrics both sides report are compared.
    for name, (_value, higher) in pairs[0]["after"].items():
        if any(name not in p["before"] for p in pairs):
            continue
        ratios = [ratio(p["before"][name][0], p["after"][name][0], higher) for p in pairs]
        summary[name] = compared(ratios, (p["before"][name][0] for p in pairs),
                                 (p["after"][name][0] for p in pairs))
    report(summary, pairs, args.out, width=36)
    return 0


def report(summary: dict[str, Any], pairs: list[Any], out: Path, width: int) -> None:
    """Print each metric's median ratio with its min-max and both sides' medians; write the
    pairs and the summary to `out` as JSON."""
    for name, s in summary.items():
        print(f"{name:{width}s} ratio median {s['median_ratio']:.3f} (min {s['min']:.3f}, max "
              f"{s['max']:.3f}); before {s['before_median']:.1f}, after {s['after_median']:.1f}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pairs": pairs, "summary": summary}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
