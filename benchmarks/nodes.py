"""W1-W3 on 1, 2 and 4 node processes against one PostgreSQL: the aggregate
rate, the share of the work each node took, W2's and W3's fraction of ideal,
and the claim p99; medians of interleaved rounds.

    benchmarks/nodes                          # 3 rounds of W1-W3 on 1, 2, 4 nodes
    benchmarks/nodes --rounds 1 --scale 0.2   # quick
    benchmarks/nodes --nodes 1,2,4,8 --workloads w1

Each run is `gendurable workload <w> --nodes N` (cli/src/cluster.rs: the
first process is a node and starts N - 1 more, each with `--concurrency`
steps at once) in a fresh database; the jobs are inserted before any node
starts and the clock runs from the first node's start until all are done.
W2's records are checked for overlapping runs of one key, W3's for more than
10 at once. Writes nodes.json, nodes.md and nodes.png to --out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    Postgres,
    Work,
    concurrency_profile,
    last_json,
    log,
    output_args,
    overlapping_pairs,
    plot,
    read_records,
    release_cli,
    run_against,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
JOBS = {"w1": 20_000, "w2": 10_000, "w3": 2_000}
# W2: 100 keys, 5 ms steps: at most min(100, slots) run at once. W3: a gate of 10, 20 ms.
PAUSE_S = {"w2": 0.005, "w3": 0.020}


def ideal(workload: str, nodes: int, concurrency: int) -> float | None:
    if workload == "w2":
        return min(100, nodes * concurrency) / PAUSE_S["w2"]
    if workload == "w3":
        return 10 / PAUSE_S["w3"]
    return None


def run(cli: Path, pg: Postgres, workload: str, nodes: int, jobs: int, concurrency: int, i: int) -> dict:
    with pg.fresh_db(f"nodes_{i}") as url, tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "records.csv"
        cmd = [cli, "workload", workload, "--nodes", nodes, "--jobs", jobs, "--concurrency", concurrency]
        if workload != "w1":
            cmd += ["--record", record]
        r = last_json(run_against(cmd, url, f"{workload} on {nodes} nodes"))
        if workload == "w2":
            r["violations"] = overlapping_pairs(read_records(record))
        elif workload == "w3":
            r["max_at_once"], r["violations"] = concurrency_profile(read_records(record))
        return r


def summary(runs: list[dict], concurrency: int) -> list[dict]:
    rows = []
    for w in sorted({r["workload"] for r in runs}):
        base = None
        for n in sorted({r["nodes"] for r in runs if r["workload"] == w}):
            rs = sorted(
                (r for r in runs if r["workload"] == w and r["nodes"] == n), key=lambda r: r["jobs_per_s"]
            )
            med = rs[len(rs) // 2]
            rate = statistics.median(r["jobs_per_s"] for r in rs)
            base = base or rate
            best = ideal(w, n, concurrency)
            rows.append(
                {
                    "workload": w,
                    "nodes": n,
                    "jobs_per_s": rate,
                    "low": rs[0]["jobs_per_s"],
                    "high": rs[-1]["jobs_per_s"],
                    "vs_one_node": rate / base,
                    "of_ideal": rate / best if best else None,
                    "shares": med["shares"],
                    "pick_p99_ms": statistics.median(r["pick_p99_ms"] for r in rs),
                    "violations": sum(r.get("violations", 0) for r in rs),
                    "rounds": len(rs),
                }
            )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| workload | nodes | jobs/s (range) | vs 1 node | % of ideal | share per node "
        "| claim p99 ms | violations |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        shares = " / ".join(f"{s:.2f}" for s in r["shares"])
        ideal_pc = f"{100 * r['of_ideal']:.0f} %" if r["of_ideal"] else ""
        out.append(
            f"| {r['workload'].upper()} | {r['nodes']} "
            f"| {r['jobs_per_s']:,.0f} ({r['low']:,.0f}–{r['high']:,.0f}) "
            f"| {r['vs_one_node']:.2f} | {ideal_pc} | {shares} | {r['pick_p99_ms']:.1f} | {r['violations']} |"
        )
    return "\n".join(out) + "\n"


def chart(rows: list[dict], path: Path, work: Work) -> None:
    body = r"""
rows = json.load(open(sys.argv[1]))["summary"]
ws = sorted({r["workload"] for r in rows})
fig, axes = plt.subplots(1, len(ws), figsize=(4 * len(ws), 3.2))
axes = axes if len(ws) > 1 else [axes]
for ax, w in zip(axes, ws):
    rs = [r for r in rows if r["workload"] == w]
    ax.bar([str(r["nodes"]) for r in rs], [r["jobs_per_s"] for r in rs], color="#2a7ab9")
    ax.errorbar([str(r["nodes"]) for r in rs], [r["jobs_per_s"] for r in rs],
                yerr=[[r["jobs_per_s"] - r["low"] for r in rs], [r["high"] - r["jobs_per_s"] for r in rs]],
                fmt="none", ecolor="#333", capsize=3)
    ax.set_title(f"{w.upper()}: jobs/s by node processes", fontsize=10)
    ax.set_xlabel("node processes")
"""
    plot(work.py, body, path.with_suffix(".json"), path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", default="1,2,4")
    p.add_argument("--workloads", default="w1,w2,w3")
    p.add_argument("--concurrency", type=int, default=20, help="steps at once per node")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the job counts")
    output_args(p)
    args = p.parse_args()
    nodes = [int(n) for n in args.nodes.split(",")]
    workloads = [w.strip() for w in args.workloads.split(",")]
    cli = release_cli()
    pg = Postgres()
    pg.start()
    runs, i = [], 0
    try:
        for rnd in range(args.rounds):
            # Each round in another order: a slow stretch of the machine falls on each count.
            order = nodes[rnd % len(nodes) :] + nodes[: rnd % len(nodes)]
            for w in workloads:
                for n in order:
                    i += 1
                    jobs = max(100, int(JOBS[w] * args.scale))
                    r = run(cli, pg, w, n, jobs, args.concurrency, i)
                    log(
                        f"round {rnd + 1}/{args.rounds} {w} on {n} node(s): {r['jobs_per_s']:,.0f} jobs/s, "
                        f"shares {' / '.join(f'{s:.2f}' for s in r['shares'])}"
                    )
                    runs.append(r)
    finally:
        pg.stop()
    rows = summary(runs, args.concurrency)
    data = {"runs": runs, "summary": rows, "concurrency": args.concurrency}
    work = write_results(args.out, "nodes", data, markdown(rows), args.work)
    chart(rows, args.out / "nodes.png", work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
