"""The PNG plots of docs/benchmarks.md, from the JSON figures the benchmarks write.

    python -m bench.plots [--figures build/bench] [--out docs/images] [--suffix=-xeon]

text-throughput.png    output tokens/s against concurrency, per contender and dtype: the median of
                       the rounds, the bars from the lowest to the highest (bench.service --json)
text-ttft.png          TTFT p99 against concurrency, the same way
repeated-images.png    TTFT p50 per case of bench.image_repeats --json, per contender and model

--tables prints the text figures as docs/benchmarks.md's markdown tables instead. --suffix goes
before each file's .png, so one machine's plots stand beside another's.
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
                    into = out[(dtype, run["name"])][int(level)]
                    for name in ("tok_s", "ttft_p99_ms", "ttft_p50_ms"):
                        into[name].append(figures[name])
                    # CPU ms a request outside the engine core: the server's main process
                    # (in-process: the one process), and the whole front end with its client
                    cpu = figures.get("cpu_ms_per_request", {})
                    if cpu:
                        into["server_cpu_ms"].append(cpu.get("server", sum(cpu.values())))
                        into["front_cpu_ms"].append(sum(cpu.values()))
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


def images_plot(folder: Path, out: Path, name: str = "repeated-images.png") -> Path | None:
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
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(values: list[float], digits: int = 1) -> str:
    middle, low, high = _spread(values)
    if len(values) == 1:
        return f"{middle:.{digits}f}"
    return f"{middle:.{digits}f} ({middle - low:.{digits}f}-{middle + high:.{digits}f})"


def text_tables(folder: Path) -> None:
    """Per dtype: each contender's median (lowest-highest) per level, then mmgate's ratios."""
    runs = _text_runs(folder)
    ratios = _text_ratios(folder)
    for dtype in sorted({d for d, _ in runs}):
        names = sorted(n for d, n in runs if d == dtype)
        levels = sorted({c for (d, _), lv in runs.items() if d == dtype for c in lv})
        print(f"\n{dtype}: median (lowest-highest) over the rounds\n")
        print(
            "| level | contender | rounds | tok/s | TTFT p50 ms | TTFT p99 ms "
            "| server CPU ms/request | with its client |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for c in levels:
            for name in names:
                f = runs[(dtype, name)].get(c)
                if not f:
                    continue
                cpu = [_cell(f[k]) if f.get(k) else "-" for k in ("server_cpu_ms", "front_cpu_ms")]
                print(
                    f"| c={c} | {name} | {len(f['tok_s'])} | {_cell(f['tok_s'])} | "
                    f"{_cell(f['ttft_p50_ms'], 0)} | {_cell(f['ttft_p99_ms'], 0)} | "
                    f"{cpu[0]} | {cpu[1]} |"
                )
        print(f"\n{dtype}: mmgate / the other, within each round: median (lowest-highest)\n")
        print("| level | against | rounds | tok/s | TTFT p99 | server CPU/request |")
        print("|---|---|---|---|---|---|")
        for (d, other, c), pair in sorted(ratios.items()):
            if d == dtype:
                server = f"{_cell(pair['server_cpu'], 2)}x" if pair.get("server_cpu") else "-"
                print(
                    f"| c={c} | {other} | {len(pair['tok_s'])} | {_cell(pair['tok_s'], 3)}x | "
                    f"{_cell(pair['ttft_p99_ms'], 2)}x | {server} |"
                )


def image_tables(folder: Path) -> None:
    """Per model: each case's TTFT p50/p99, bytes sent and counts per contender, and the ratios."""
    for path in sorted(folder.glob("images-*.json")):
        data = json.loads(path.read_text())
        about = data["about"]
        print(
            f"\n{about['model']} (vLLM's encoder cache: {about['encoder_cache_tokens']} tokens)\n"
        )
        print(
            "| case | contender | TTFT p50 | p99 | req/s | bytes/request | counted "
            "| burst of 8: TTFT p50, counted |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for label, sides in data["results"].items():
            if label.startswith("_"):
                continue
            for name, figures in sides.items():
                run, burst = figures["run"], figures["burst"]
                counted = ", ".join(f"{k} {v:.0f}" for k, v in run["counts"].items())
                burst_counted = ", ".join(f"{k} {v:.0f}" for k, v in burst["counts"].items())
                print(
                    f"| {label} | {name} | {run['ttft_p50_ms']:.1f} ms | "
                    f"{run['ttft_p99_ms']:.1f} ms | "
                    f"{run['requests_per_s']:.2f} | {run['bytes_per_request']:,.0f} | {counted} | "
                    f"{burst['ttft_p50_ms']:.0f} ms, {burst_counted} |"
                )
        print(
            "\n| case | vllm-base64 / mmgate TTFT p50 | vllm-uuid / mmgate "
            "| burst: vllm-base64 / mmgate |"
        )
        print("|---|---|---|---|")
        for label, sides in data["results"].items():
            if label.startswith("_") or "mmgate" not in sides:
                continue
            mine = sides["mmgate"]
            cells = [
                f"{sides[n]['run']['ttft_p50_ms'] / mine['run']['ttft_p50_ms']:.2f}x"
                if n in sides
                else "-"
                for n in ("vllm-base64", "vllm-uuid")
            ]
            theirs = sides.get("vllm-base64")
            burst = (
                f"{theirs['burst']['ttft_p50_ms'] / mine['burst']['ttft_p50_ms']:.2f}x"
                if theirs is not None
                else "-"
            )
            print(f"| {label} | {cells[0]} | {cells[1]} | {burst} |")


def _text_ratios(folder: Path) -> dict[tuple[str, str, int], dict[str, list[float]]]:
    """(dtype, the other contender, level) -> figure -> mmgate / other, one per round."""
    out: dict[tuple[str, str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.glob("text-*.json")):
        data = json.loads(path.read_text())
        for runs in data["rounds"]:
            named = {run["name"]: run for run in runs}
            mine = next((r for n, r in named.items() if n.startswith("mmgate")), None)
            if mine is None:
                continue
            for name, run in named.items():
                if run is mine:
                    continue
                for level, figures in run["levels"].items():
                    ours = mine["levels"].get(level)
                    if ours is None:
                        continue
                    key = (data["about"]["dtype"], name, int(level))
                    for figure in ("tok_s", "ttft_p99_ms"):
                        out[key][figure].append(ours[figure] / figures[figure])
                    theirs_cpu = figures.get("cpu_ms_per_request", {}).get("server")
                    ours_cpu = ours.get("cpu_ms_per_request", {}).get("server")
                    if theirs_cpu and ours_cpu:
                        out[key]["server_cpu"].append(ours_cpu / theirs_cpu)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--figures", type=Path, default=Path("build/bench"))
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--tables", action="store_true", help="markdown tables, no plots")
    parser.add_argument("--suffix", default="", help="put before .png in every file's name")
    args = parser.parse_args()
    if args.tables:
        text_tables(args.figures)
        image_tables(args.figures)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    made = [
        text_plot(
            args.figures, args.out, "tok_s", "output tokens/s", f"text-throughput{args.suffix}.png"
        ),
        text_plot(
            args.figures, args.out, "ttft_p99_ms", "TTFT p99 (ms)", f"text-ttft{args.suffix}.png"
        ),
        images_plot(args.figures, args.out, f"repeated-images{args.suffix}.png"),
    ]
    for path in made:
        if path is not None:
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
