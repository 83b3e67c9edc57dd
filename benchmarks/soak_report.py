"""The soak's report, shared by benchmarks/soak (gendurable) and benchmarks/soak_peer
(graphile-worker): adds the W1 rate the soak was paced from to RESULT.json, writes
the first-5-min vs last-5-min table to RESULT.md (and prints it) and the chart to
RESULT.png (when matplotlib is there: benchmarks/.peers/venv has it).

    soak_report.py RESULT.json W1_JOBS_PER_S [FRACTION]

Reads what the soak wrote (cli/src/soak.rs or runners/graphile_soak.mjs): the
means of the first and last five minutes, the sizes, and the 10 s samples.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Latencies a soak may report: (key in the samples, label). gendurable times its
# claiming calls; graphile-worker's runner times its batch fetch and the start
# of each job after its run_at.
LATENCIES = [
    ("claim_p99_ms", "claim p99 ms"),
    ("fetch_p99_ms", "fetch p99 ms (the get_job batch query)"),
    ("start_p99_ms", "start latency p99 ms (start − run_at)"),
]


def num(d: dict, key: str) -> float:
    v = d.get(key)
    return float("nan") if v is None else v


def table(d: dict) -> str:
    s = d["samples"]
    fraction = d.get("fraction", 0.7)
    process = d.get("process", "node")
    lines = [
        "| soak | first 5 min | last 5 min |",
        "|---|---:|---:|",
        f"| completed jobs/s (inserted {d['rate']:,.0f}/s, {100 * fraction:.0f} % of W1's "
        f"{d['w1_jobs_per_s']:,.0f}) | {num(d, 'first5_completed_per_s'):,.0f} "
        f"| {num(d, 'last5_completed_per_s'):,.0f} |",
    ]
    for key, label in LATENCIES:
        if f"first5_{key}" in d:
            lines.append(f"| {label} | {num(d, f'first5_{key}'):.1f} | {num(d, f'last5_{key}'):.1f} |")
    lines += [
        f"| {process} memory (RSS) MB | {num(d, 'rss_mb_first5'):.0f} | {num(d, 'rss_mb_last5'):.0f} |",
    ]
    if "heap_mb_first5" in d:
        lines.append(
            f"| {process} heap in use MB | {num(d, 'heap_mb_first5'):.0f} | {num(d, 'heap_mb_last5'):.0f} |"
        )
    lines += [
        f"| table MB (first, max, last) | {num(d, 'table_mb_first'):,.0f} "
        f"| {num(d, 'table_mb_max'):,.0f} / {num(d, 'table_mb_last'):,.0f} |",
        f"| indexes MB (first, max, last) | {num(d, 'indexes_mb_first'):,.0f} "
        f"| {num(d, 'indexes_mb_max'):,.0f} / {num(d, 'indexes_mb_last'):,.0f} |",
    ]
    if s and "dead_rows" in s[0]:
        dead = [x["dead_rows"] for x in s]
        lines.append(f"| dead rows (first, max, last) | {dead[0]:,} | {max(dead):,} / {dead[-1]:,} |")
        lines.append(f"| autovacuum runs (by the end) | | {s[-1]['autovacuums']:,} |")
    lines.append(f"| backlog at the end | | {d['backlog_last']:,} |")
    md = "\n".join(lines) + "\n"
    notes = d.get("notes") or []
    if notes:
        md += "\n" + "".join(f"- {n}\n" for n in notes)
    return md


def chart(d: dict, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = d["samples"]
    t = [x["t"] / 60 for x in s]
    lat = [(k, label) for k, label in LATENCIES if s and k in s[0]]
    panels = [
        ([("completed_per_s", "completed")], "completed jobs/s"),
        (lat, lat[0][1] if len(lat) == 1 else "latency p99 (ms)"),
        ([("backlog", "backlog")], "backlog (jobs)"),
        ([("table_mb", "table + indexes")], "table + indexes (MB)"),
        (
            [(k, label) for k, label in [("rss_mb", "RSS"), ("heap_mb", "heap in use")] if k in s[0]],
            f"{d.get('process', 'node')} memory (MB)",
        ),
    ]
    fig, ax = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for a, (series, title) in zip(ax, panels, strict=True):
        for key, label in series:
            ys = [x[key] + (x["indexes_mb"] if key == "table_mb" else 0) for x in s]
            a.plot(t, ys, label=label.split(" (")[0])
        a.set_title(title, fontsize=10)
        a.set_xlabel("minutes")
        if len(series) > 1:
            a.legend(fontsize=8)
        if series is lat and len(series) > 1:  # latencies apart by orders of magnitude
            a.set_yscale("log")
        else:
            a.set_ylim(bottom=0)
    fig.suptitle(f"{d.get('system', '')} soak", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    d = json.loads(path.read_text())
    d["w1_jobs_per_s"] = float(sys.argv[2])
    if len(sys.argv) == 4:
        d["fraction"] = float(sys.argv[3])
    path.write_text(json.dumps(d, indent=1) + "\n")
    md = table(d)
    path.with_suffix(".md").write_text(md)
    print(md)
    if d.get("samples"):
        chart(d, path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
