"""The results table across worlds, made from ``primus eval`` reports (which stay out of git).

``make eval-worlds`` writes one report per world (``.primus/eval/<world>/report.json``); this module
reads them and renders one markdown table: per world, each mode's AUC (mean over the data seeds),
every baseline at its best over its tuning grid (the variants ``MODE[lr=...]`` in the report, the
less favourable comparison for MTRM), and MTRM (spec defaults) minus the best baseline with the
smallest per-seed difference. ``--write FILE`` replaces the block between the ``results`` markers
of FILE (docs/training.md).

    python -m primus_lib.evaluation.results .primus/eval [--write docs/training.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from primus_lib.markdown import replace_block

BEGIN, END = "<!-- results:begin (make eval-report) -->", "<!-- results:end -->"
BASELINES = ("offline", "online", "offline_then_online", "single_tower")


@dataclass
class WorldResult:
    world: str
    split: str
    late: float | None
    seeds: list[int]
    auc: dict[str, dict[int, float]]  # run name -> seed -> AUC

    def best(self, mode: str) -> tuple[str, float] | None:
        """The run of ``mode`` (a variant included) with the highest mean AUC over the seeds."""
        runs = [(n, _mean(v)) for n, v in self.auc.items() if n.split("[")[0] == mode and v]
        return max(runs, key=lambda r: r[1]) if runs else None

    def lead(self, mode: str = "mtrm") -> tuple[float, float, str] | None:
        """``mode`` minus the strongest baseline (each at its best): mean and smallest per-seed difference."""
        mine = self.auc.get(mode)
        bests = [b for b in (self.best(m) for m in BASELINES) if b is not None]
        if not mine or not bests:
            return None
        name, _ = max(bests, key=lambda b: b[1])
        theirs = self.auc[name]
        diffs = [mine[s] - theirs[s] for s in mine if s in theirs]
        return _mean(dict(enumerate(diffs))), min(diffs), name


def _mean(values: dict) -> float:
    return sum(values.values()) / len(values)


def load(root: Path) -> list[WorldResult]:
    """Every ``<world>/report.json`` under ``root``."""
    from primus_lib.data.datagen.worlds import WORLDS

    results = []
    for path in sorted(Path(root).glob("*/report.json")):
        doc = json.loads(path.read_text())
        world = doc.get("world") or path.parent.name
        named = WORLDS.get(world.split(",")[0])
        auc = {
            name: dict(zip(entry["seeds"], entry["auc_per_seed"], strict=True))
            for name, entry in doc["modes"].items()
            if "auc_per_seed" in entry
        }
        seeds = sorted({s for v in auc.values() for s in v})
        results.append(WorldResult(world, named.split if named else "-", named.late if named else None, seeds, auc))
    order = {"development": 0, "seen": 1, "held-out": 2}
    return sorted(results, key=lambda r: (order.get(r.split, 2), r.world))


def table(results: list[WorldResult]) -> str:
    head = "| world | split | late clicks | seeds | " + " | ".join(BASELINES) + " | mtrm | mtrm − best (min seed) |"
    lines = [head, "|" + "---|" * (len(BASELINES) + 6)]
    for r in results:
        cells = []
        for mode in BASELINES:
            best = r.best(mode)
            tag = "" if best is None or "[" not in best[0] else " " + best[0][len(mode) :]
            cells.append("-" if best is None else f"{best[1]:.4f}{tag}")
        mtrm = r.auc.get("mtrm")
        lead = r.lead()
        late = "-" if r.late is None else f"{r.late:.0%}"
        lead_cell = "-" if lead is None else f"{lead[0]:+.4f} ({lead[1]:+.4f}) vs {lead[2]}"
        lines.append(
            f"| {r.world} | {r.split} | {late} | {len(r.seeds)} | "
            + " | ".join(cells)
            + f" | {'-' if not mtrm else f'{_mean(mtrm):.4f}'} | {lead_cell} |"
        )
    return "\n".join(lines)


def write_block(path: Path, text: str) -> None:
    """Replace the text between the results markers of ``path``."""
    try:
        path.write_text(replace_block(path.read_text(), BEGIN, END, text))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m primus_lib.evaluation.results", description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="directory of <world>/report.json (make eval-worlds)")
    parser.add_argument("--write", type=Path, help="replace the results block of this markdown file")
    args = parser.parse_args(argv)
    results = load(args.root)
    if not results:
        print(f"results: no <world>/report.json under {args.root}", file=sys.stderr)
        return 2
    text = table(results)
    print(text)
    if args.write:
        try:
            write_block(args.write, text)
        except ValueError as exc:
            print(f"results: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
