"""The PNG plots of docs/benchmarks.md, from the JSON figures the benchmarks write.

    python -m bench.plots [--figures build/bench] [--out docs/images]

text-throughput.png    output tokens/s against concurrency, per contender and dtype: the median of
                       the rounds, the bars from the lowest to the highest (bench.service --json)
text-ttft.png          TTFT p99 against concurrency, the same way
repeated-images.png    TTFT p50 per case of bench.image_repeats --json, per contender and model
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt


def _text_runs(folder: Path) -> dict[tuple[str, str], dict[int, dict[str, list[float]]]]:
    """(dtype, contender) -> concurrency -> figure -> one value per round."""
    out: dict[tuple[str, str], dict[int, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for path in sorted(folder.glob("text-*.json")):
        data = json.loads(path.read_text())
        dtype = data["about"]["dtype"]
        for runs in data["rounds"]:
            for run in runs:
                for level, figures in run["levels"].items():
                    for name in ("tok_s", "ttft_p99_ms", "ttft_p50_ms"):
                        out[(dtype, run["name"])][int(level)][name].append(figures[name])
    return out


def _spread(values: list[float]) -> tuple[float, float, float]:
    middle = statistics.median(values)
    return middle, middle - min(values), max(values) - middle


def text_plot(folder: Path, out: Path, figure: str, label: str, name: str) -> Path | None:
    runs = _text_runs(folder)
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (dtype, contender), levels in sorted(runs.items()):
        xs = sorted(levels)
        spreads = [_spread(levels[c][figure]) for c in xs]
        ax.errorbar(
            xs,
            [s[0] for s in spreads],
            yerr=[[s[1] for s in spreads], [s[2] for s in spreads]],
            marker="o",
            capsize=3,
            linestyle="-" if dtype == "float32" else "--",
            label=f"{contender}, {dtype}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"SmolLM2-135M on 2 CPU cores, 64 tokens: {label}")
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def images_plot(folder: Path, out: Path) -> Path | None:
    files = sorted(folder.glob("images-*.json"))
    if not files:
        return None
    rows: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        data = json.loads(path.read_text())
        for label, sides in data["results"].items():
            if not label.startswith("_"):
                rows.append((f"{data['about']['model']}: {label}", sides))
    contenders = sorted({name for _, sides in rows for name in sides})
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) * len(contenders) + 1.5))
    height = 0.8 / len(contenders)
    for k, name in enumerate(contenders):
        ys = [i + k * height for i in range(len(rows))]
        xs = [sides.get(name, {}).get("run", {}).get("ttft_p50_ms", 0.0) for _, sides in rows]
        ax.barh(ys, xs, height=height, label=name)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))])
    ax.set_yticklabels([label for label, _ in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT p50 (ms, log scale)")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Repeated images: mmgate against vLLM's server (8 tokens, concurrency 1)")
    fig.tight_layout()
    path = out / "repeated-images.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--figures", type=Path, default=Path("build/bench"))
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    made = [
        text_plot(args.figures, args.out, "tok_s", "output tokens/s", "text-throughput.png"),
        text_plot(args.figures, args.out, "ttft_p99_ms", "TTFT p99 (ms)", "text-ttft.png"),
        images_plot(args.figures, args.out),
    ]
    for path in made:
        if path is not None:
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
