"""W1 beside the raw SKIP LOCKED loop on the engine's own table: how close
the node comes to what PostgreSQL does when nothing but the claim and the
completion run, and what its start costs; medians of interleaved rounds.

    benchmarks/db_limit                       # 3 rounds, 100,000 rows each
    benchmarks/db_limit --rounds 1 --rows 20000

Each round, in a fresh database each: `benchmarks/own_table.sh` (pgbench,
2 loops, the raw claim and completion of 160 and of 400 rows per statement
on a migrated `instances` table) and `gendurable workload w1` (one node, 20
steps at once). W1's whole rate runs from the node's start to its last
outcome; its steady rate is between a tenth and nine tenths of the jobs
done, and its ramp is the time to the first tenth beyond what the steady
rate would have taken (`cli/src/workload.rs`, `Pace`). Writes db_limit.json,
db_limit.md and db_limit.png to --out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    Postgres,
    Work,
    last_json,
    log,
    output_args,
    plot,
    release_cli,
    run_against,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
BATCHES = [160, 400]


def raw(url: str, rows: int, batch: int) -> float:
    out = run_against([HERE / "own_table.sh", rows, 2, batch], url, "own_table.sh")
    line = next(ln for ln in out.splitlines() if ln.endswith("rows/s"))
    return float(line.split()[0])


def w1(cli: Path, url: str, rows: int) -> dict:
    return last_json(run_against([cli, "workload", "w1", "--jobs", rows], url, "w1"))


def med(rs: list[dict], key: str) -> dict:
    xs = sorted(r[key] for r in rs)
    return {"median": statistics.median(xs), "low": xs[0], "high": xs[-1]}


def summary(rounds: list[dict]) -> dict:
    s = {f"raw_{b}": med(rounds, f"raw_{b}") for b in BATCHES}
    for k in ["w1", "w1_steady", "ramp_ms"]:
        s[k] = med(rounds, k)
    s["steady_vs_raw_400"] = med(rounds, "steady_vs_raw_400")
    return s


def markdown(s: dict) -> str:
    def cell(k: str, digits: int = 0) -> str:
        m = s[k]
        return f"{m['median']:,.{digits}f} ({m['low']:,.{digits}f}–{m['high']:,.{digits}f})"

    return "\n".join(
        [
            "| | rows/s (range) |",
            "|---|---:|",
            f"| raw loop, engine's table, 160 rows a statement | {cell('raw_160')} |",
            f"| raw loop, engine's table, 400 rows a statement | {cell('raw_400')} |",
            f"| gendurable W1, start to last outcome | {cell('w1')} |",
            f"| gendurable W1, steady (a tenth to nine tenths done) | {cell('w1_steady')} |",
            "",
            f"W1 steady against the 400-row raw loop of the same round: {cell('steady_vs_raw_400', 2)}; "
            f"the start-up ramp: {cell('ramp_ms')} ms.",
            "",
        ]
    )


def chart(path: Path, work: Work) -> None:
    body = r"""
s = json.load(open(sys.argv[1]))["summary"]
keys = [("raw_160", "raw loop\n160 rows"), ("raw_400", "raw loop\n400 rows"),
        ("w1", "W1\nwhole run"), ("w1_steady", "W1\nsteady")]
ms = [s[k] for k, _ in keys]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.bar([l for _, l in keys], [m["median"] for m in ms], color=["#999", "#999", "#2a7ab9", "#2a7ab9"])
ax.errorbar([l for _, l in keys], [m["median"] for m in ms],
            yerr=[[m["median"] - m["low"] for m in ms], [m["high"] - m["median"] for m in ms]],
            fmt="none", ecolor="#333", capsize=3)
ax.set_ylabel("rows (jobs) per second")
ax.set_title("W1 beside the raw SKIP LOCKED loop on the engine's table", fontsize=10)
"""
    plot(work.py, body, path.with_suffix(".json"), path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=100_000)
    output_args(p)
    args = p.parse_args()
    cli = release_cli()
    pg = Postgres()
    pg.start()
    rounds, i = [], 0
    try:
        for rnd in range(args.rounds):
            r = {}
            # Each round in another order: a slow stretch of the machine falls on each.
            order = ["w1", *BATCHES] if rnd % 2 == 0 else [*BATCHES, "w1"]
            for what in order:
                i += 1
                if what == "w1":
                    with pg.fresh_db(f"db_limit_{i}") as url:
                        out = w1(cli, url, args.rows)
                    r.update(w1=out["jobs_per_s"], w1_steady=out["steady_jobs_per_s"], ramp_ms=out["ramp_ms"])
                else:
                    with pg.fresh_db(f"db_limit_{i}") as url:
                        r[f"raw_{what}"] = raw(url, args.rows, what)
            r["steady_vs_raw_400"] = r["w1_steady"] / r["raw_400"]
            log(
                f"round {rnd + 1}/{args.rounds}: raw {r['raw_160']:,.0f} / {r['raw_400']:,.0f} rows/s, "
                f"W1 {r['w1']:,.0f} (steady {r['w1_steady']:,.0f}, ramp {r['ramp_ms']:.0f} ms)"
            )
            rounds.append(r)
    finally:
        pg.stop()
    s = summary(rounds)
    data = {"rounds": rounds, "summary": s, "rows": args.rows}
    work = write_results(args.out, "db_limit", data, markdown(s), args.work)
    chart(args.out / "db_limit.png", work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
