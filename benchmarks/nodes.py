"""W1-W3 on 1, 2 and 4 node processes against one PostgreSQL: the aggregate
rate, the share of the work each node took, W2's and W3's fraction of ideal,
the claim p99, and the steady rate (between a tenth and nine tenths of the
jobs done) beside the whole run's; medians of interleaved rounds.

    benchmarks/nodes                          # 3 rounds of W1-W3 on 1, 2, 4 nodes
    benchmarks/nodes --rounds 1 --scale 0.2   # quick
    benchmarks/nodes --nodes 1,2,4,8 --workloads w1
    benchmarks/nodes --systems gendurable,graphile-worker --workloads w1,w2

Each run is `gendurable workload <w> --nodes N` (cli/src/cluster.rs: the
first process is a node and starts N - 1 more, each with `--concurrency`
steps at once) in a fresh database; the jobs are inserted before any node
starts and the clock runs from the first node's start until all are done.
W2's records are checked for overlapping runs of one key, W3's for more than
10 at once. Writes nodes.json, nodes.md and nodes.png to --out.

graphile-worker runs beside it where it can (`--systems`): its runner with
`--nodes N` inserts, then starts N - 1 more worker processes and works beside
them (benchmarks/runners/graphile_runner.mjs). W3 has no graphile-worker
equivalent (no limit above one per queue).
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
    runner_command,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
# W1 runs 100,000 jobs, not the first benchmark's 20,000: four nodes claim
# 20,000 rows in their first calls, so a run that short has no steady state.
JOBS = {"w1": 100_000, "w2": 10_000, "w3": 2_000}
SYSTEMS = ["gendurable", "graphile-worker"]
UNSUPPORTED = {("graphile-worker", "w3")}
# W2: 100 keys, 5 ms steps: at most min(100, slots) run at once. W3: a gate of 10, 20 ms.
PAUSE_S = {"w2": 0.005, "w3": 0.020}


def ideal(workload: str, nodes: int, concurrency: int) -> float | None:
    if workload == "w2":
        return min(100, nodes * concurrency) / PAUSE_S["w2"]
    if workload == "w3":
        return 10 / PAUSE_S["w3"]
    return None


def run(
    system: str, cmd: list, pg: Postgres, workload: str, nodes: int, jobs: int, concurrency: int, i: int
) -> dict:
    with pg.fresh_db(f"nodes_{i}") as url, tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "records.csv"
        cmd = [*cmd, workload, "--nodes", nodes, "--jobs", jobs, "--concurrency", concurrency]
        if workload != "w1":
            cmd += ["--record", record]
        r = last_json(run_against(cmd, url, f"{system} {workload} on {nodes} nodes"))
        r["system"] = system
        if workload == "w2":
            r["violations"] = overlapping_pairs(read_records(record))
        elif workload == "w3":
            r["max_at_once"], r["violations"] = concurrency_profile(read_records(record))
        return r


def summary(runs: list[dict], concurrency: int) -> list[dict]:
    rows = []
    for w, system in sorted(
        {(r["workload"], r["system"]) for r in runs}, key=lambda k: (k[0], SYSTEMS.index(k[1]))
    ):
        base = steady_base = None
        mine = [r for r in runs if r["workload"] == w and r["system"] == system]
        for n in sorted({r["nodes"] for r in mine}):
            rs = sorted((r for r in mine if r["nodes"] == n), key=lambda r: r["jobs_per_s"])
            med = rs[len(rs) // 2]
            rate = statistics.median(r["jobs_per_s"] for r in rs)
            base = base or rate
            steady = (
                statistics.median(r["steady_jobs_per_s"] for r in rs)
                if all("steady_jobs_per_s" in r for r in rs)
                else None
            )
            steady_base = steady_base or steady
            best = ideal(w, n, concurrency)
            rows.append(
                {
                    "workload": w,
                    "system": system,
                    "nodes": n,
                    "jobs_per_s": rate,
                    "low": rs[0]["jobs_per_s"],
                    "high": rs[-1]["jobs_per_s"],
                    "vs_one_node": rate / base,
                    "steady": steady,
                    "steady_vs_one_node": steady / steady_base if steady and steady_base else None,
                    "ramp_ms": statistics.median(r["ramp_ms"] for r in rs) if steady else None,
                    "of_ideal": rate / best if best else None,
                    "shares": med["shares"],
                    "pick_p99_ms": statistics.median(r["pick_p99_ms"] for r in rs)
                    if "pick_p99_ms" in med
                    else None,
                    "violations": sum(r.get("violations", 0) for r in rs),
                    "rounds": len(rs),
                }
            )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| workload | system | nodes | jobs/s (range) | vs 1 node | steady jobs/s | steady vs 1 node "
        "| start-up ramp ms | % of ideal | share per node | claim p99 ms | violations |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        shares = " / ".join(f"{s:.2f}" for s in r["shares"])
        ideal_pc = f"{100 * r['of_ideal']:.0f} %" if r["of_ideal"] else ""
        p99 = f"{r['pick_p99_ms']:.1f}" if r["pick_p99_ms"] is not None else ""
        steady = f"{r['steady']:,.0f}" if r.get("steady") else ""
        steady_vs = f"{r['steady_vs_one_node']:.2f}" if r.get("steady_vs_one_node") else ""
        ramp = f"{r['ramp_ms']:.0f}" if r.get("ramp_ms") is not None else ""
        out.append(
            f"| {r['workload'].upper()} | {r['system']} | {r['nodes']} "
            f"| {r['jobs_per_s']:,.0f} ({r['low']:,.0f}–{r['high']:,.0f}) "
            f"| {r['vs_one_node']:.2f} | {steady} | {steady_vs} | {ramp} | {ideal_pc} | {shares} "
            f"| {p99} | {r['violations']} |"
        )
    return "\n".join(out) + "\n"


def chart(rows: list[dict], path: Path, work: Work) -> None:
    body = r"""
rows = json.load(open(sys.argv[1]))["summary"]
ws = sorted({r["workload"] for r in rows})
fig, axes = plt.subplots(1, len(ws), figsize=(4 * len(ws), 3.2))
axes = axes if len(ws) > 1 else [axes]
colors = {"gendurable": "#2a7ab9", "graphile-worker": "#c0792b"}
for ax, w in zip(axes, ws):
    systems = [s for s in colors if any(r["workload"] == w and r["system"] == s for r in rows)]
    width = 0.8 / len(systems)
    for k, s in enumerate(systems):
        rs = [r for r in rows if r["workload"] == w and r["system"] == s]
        xs = [r["nodes"] for r in rs]
        pos = [i + (k - (len(systems) - 1) / 2) * width for i in range(len(xs))]
        ys = [r["jobs_per_s"] for r in rs]
        ax.bar(pos, ys, width, color=colors[s], label=s)
        err = [[y - r["low"] for y, r in zip(ys, rs)], [r["high"] - y for y, r in zip(ys, rs)]]
        ax.errorbar(pos, ys, yerr=err, fmt="none", ecolor="#333", capsize=3)
        steady = [(x, r["steady"]) for x, r in zip(pos, rs) if r.get("steady")]
        if steady:
            ax.scatter(*zip(*steady), marker="_", s=300, color="black", zorder=3,
                       label="steady rate" if k == len(systems) - 1 else None)
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_title(f"{w.upper()}: jobs/s by node processes (bars: whole run)", fontsize=10)
    ax.set_xlabel("node processes")
    ax.legend(fontsize=8)
"""
    plot(work.py, body, path.with_suffix(".json"), path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", default="1,2,4")
    p.add_argument("--workloads", default="w1,w2,w3")
    p.add_argument("--systems", default="gendurable", help="comma list of: " + ", ".join(SYSTEMS))
    p.add_argument("--concurrency", type=int, default=20, help="steps at once per node")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the job counts")
    output_args(p)
    args = p.parse_args()
    nodes = [int(n) for n in args.nodes.split(",")]
    workloads = [w.strip() for w in args.workloads.split(",")]
    systems = [s.strip() for s in args.systems.split(",")]
    if unknown := set(systems) - set(SYSTEMS):
        p.error(f"unknown systems: {', '.join(sorted(unknown))}")
    cli = release_cli()
    work = Work(args.work.resolve(), False)
    if "graphile-worker" in systems:
        work.node_env()
    pg = Postgres()
    pg.start()
    runs, i = [], 0
    try:
        for rnd in range(args.rounds):
            # Each round in another order: a slow stretch of the machine falls on each count.
            order = nodes[rnd % len(nodes) :] + nodes[: rnd % len(nodes)]
            for w in workloads:
                for n in order:
                    for system in systems:
                        if (system, w) in UNSUPPORTED:
                            continue
                        i += 1
                        jobs = max(100, int(JOBS[w] * args.scale))
                        r = run(
                            system, runner_command(system, work, cli), pg, w, n, jobs, args.concurrency, i
                        )
                        shares = " / ".join(f"{s:.2f}" for s in r["shares"])
                        log(
                            f"round {rnd + 1}/{args.rounds} {system} {w} on {n} node(s): "
                            f"{r['jobs_per_s']:,.0f} jobs/s, shares {shares}"
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
