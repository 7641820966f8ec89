"""The backtest report: report.json, auc.png and a printed table (mean and spread over seeds)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import numpy as np

from primus_lib.durable import atomic_write
from primus_lib.train.model.metrics import auc, logloss


class Report:
    def __init__(self, out: Path, names: list[str]):
        self.out = Path(out)
        self.names = names
        self.results: dict[str, list] = defaultdict(list)

    def add(self, result) -> None:
        self.results[result.config.name].append(result)

    @staticmethod
    def overall(result) -> dict:
        labels = np.concatenate(result.labels) if result.labels else np.zeros(0)
        served = np.concatenate(result.probs["served"]) if result.labels else np.zeros(0)
        out = {"auc": auc(labels, served), "logloss": logloss(labels, served), "samples": int(labels.size)}
        for tower in ("memory", "adapt", "reread"):  # MTRM: each tower alone
            if result.probs.get(tower):
                out[f"{tower}_auc"] = auc(labels, np.concatenate(result.probs[tower]))
        window_aucs = [w["auc"] for w in result.windows if w["auc"] is not None]
        out["mean_window_auc"] = float(np.mean(window_aucs)) if window_aucs else None
        return out

    def summary(self) -> dict:
        modes = {}
        for name in self.names:
            runs = self.results.get(name, [])
            if not runs:
                continue
            per_seed = [self.overall(r) for r in runs]
            entry: dict = {"seeds": [r.seed for r in runs], "samples": per_seed[0]["samples"]}
            for metric in ("auc", "logloss", "mean_window_auc", "memory_auc", "adapt_auc", "reread_auc"):
                values = [s[metric] for s in per_seed if s.get(metric) is not None]
                if values:
                    entry[metric] = float(np.mean(values))
                    entry[f"{metric}_std"] = float(np.std(values))
                    entry[f"{metric}_per_seed"] = values
            entry["steps"] = runs[0].steps
            entry["seconds_per_run"] = float(np.mean([r.seconds for r in runs]))
            modes[name] = entry
        return modes

    def paired(self, base: str = "mtrm") -> dict:
        """Per-seed difference of overall AUC: ``base`` minus each other mode (same data, same seed)."""
        if base not in self.results:
            return {}
        mine = {r.seed: self.overall(r)["auc"] for r in self.results[base]}
        deltas = {}
        for name, runs in self.results.items():
            if name == base:
                continue
            diffs = [mine[r.seed] - self.overall(r)["auc"] for r in runs if r.seed in mine]
            if diffs:
                deltas[name] = {"mean": float(np.mean(diffs)), "min": float(np.min(diffs)), "max": float(np.max(diffs))}
        return deltas

    def windows(self) -> list[dict]:
        table: dict[str, dict] = defaultdict(dict)
        for name in self.names:
            for column in zip(*[r.windows for r in self.results.get(name, [])], strict=True):
                aucs = [w["auc"] for w in column if w["auc"] is not None]
                losses = [w["logloss"] for w in column if w["logloss"] is not None]
                table[column[0]["window"]][name] = {
                    "auc": float(np.mean(aucs)) if aucs else None,
                    "logloss": float(np.mean(losses)) if losses else None,
                    "samples": column[0]["samples"],
                }
        return [{"window": w, **v} for w, v in sorted(table.items())]

    def write(self, job, start, end, timeline, options) -> None:
        window = job.spec.timer.window_size
        document = {
            "job": job.name,
            "range": [start.isoformat(), end.isoformat()],
            "eval_from": timeline.hours[timeline.eval_from].isoformat(),
            "window_hours": window / timedelta(hours=1),
            "lag_hours": timeline.lag_hours * window / timedelta(hours=1),  # the timeline counts windows
            "label": "complete (clicks joined later); the stream trains on the real-time label",
            "data_seeds": options.data_seeds,
            "model_seed_offset": options.model_seed_offset,
            "world": options.world if options.data_seeds else None,
            "capacity": options.capacity,
            "modes": self.summary(),
            "mtrm_auc_minus": self.paired(),
            "windows": self.windows(),
        }
        atomic_write(self.out / "report.json", json.dumps(document, indent=1))
        self.plot(self.out / "auc.png")

    def plot(self, path: Path) -> None:
        plot_windows(path, self.names, self.windows())

    def table(self) -> str:
        summary = self.summary()
        lines = [f"{'mode':<44}{'AUC':>10}{'± std':>9}{'logloss':>10}{'± std':>9}{'samples':>9}"]
        for name, e in summary.items():
            lines.append(
                f"{name:<44}{e.get('auc', float('nan')):>10.4f}{e.get('auc_std', 0):>9.4f}"
                f"{e.get('logloss', float('nan')):>10.4f}{e.get('logloss_std', 0):>9.4f}{e['samples']:>9}"
            )
        for name, d in self.paired().items():
            lines.append(f"mtrm - {name}: AUC {d['mean']:+.4f} (per seed {d['min']:+.4f}..{d['max']:+.4f})")
        return "\n".join(lines)


def plot_windows(path: Path, names: list[str], rows: list[dict]) -> None:
    """AUC per window per mode (report.json's ``windows``) as a PNG, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    for name in names:
        ys = [np.nan if r.get(name, {}).get("auc") is None else r[name]["auc"] for r in rows]
        ablation = "[" in name  # variants: thin dashed lines behind the five modes (None: matplotlib's default)
        linestyle, linewidth, alpha = ("--", 0.8, 0.7) if ablation else (None, 1.8, None)
        ax.plot(range(len(rows)), ys, label=name, linestyle=linestyle, linewidth=linewidth, alpha=alpha)
    ticks = list(range(0, len(rows), max(1, len(rows) // 12)))
    ax.set_xticks(ticks, [rows[i]["window"][4:13] for i in ticks], rotation=30, fontsize=8)
    ax.set_ylabel("AUC (complete label), mean over seeds")
    ax.set_title("Progressive validation AUC per stream window")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)
