#!/usr/bin/env bash
# W5: unrelated no-op jobs behind blocked backlogs, beside W1 in the same
# run. Each round runs `gendurable workload w1` and then `gendurable workload
# w5` (each in a fresh schema): W5 inserts `backlog` rows of a gate of 10 and
# as many of one busy K = 1 key (1 s steps), a tenth as many under a rate
# limit of 50/s, then `jobs` unrelated no-op jobs at the same priority, and
# times those. Prints each run's JSON line, then the medians and W5 / W1.
#
#   benchmarks/w5.sh [rounds] [backlog] [jobs] [nodes]   # default 3 1000000 20000 1
#   PREFETCH=100 benchmarks/w5.sh 3    # W1 and W5 both claiming at most 100 rows ahead
#
# PREFETCH trades throughput for the claiming calls' latency: each call then
# carries about a hundred rows instead of 50 ms of starts.
#
# Each round also times one-row updates committed alone on the same server
# (`gendurable workload commit`): a claiming call commits, so its p99 can be
# no lower than that floor.
#
# On DATABASE_URL, or a throwaway PostgreSQL per run when it is unset.
#
# This is gendurable's own loop (no peers, no record checks, the CLI's own
# hold of 20 s, backlog and jobs set apart). The harness runs the same
# `gendurable workload w5` beside the peers' W5 runners, in a fresh database
# per run, and checks the gate, key and rate limits from the records:
#
#   benchmarks/run --systems gendurable --workloads w1,w5 --repeat 3   # as here, checked
#   benchmarks/run --workloads w1,w5 --scale 0.05                      # every system, quick
set -euo pipefail
rounds=${1:-3} backlog=${2:-1000000} jobs=${3:-20000} nodes=${4:-}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cli="$here/../target/release/gendurable"
prefetch=${PREFETCH:+--prefetch $PREFETCH}
cargo build -q --release --locked -p gendurable-cli --manifest-path "$here/../Cargo.toml"
out=$(mktemp)
for r in $(seq "$rounds"); do
    echo "round $r/$rounds" >&2
    "$cli" workload commit | tee -a "$out"
    "$cli" workload w1 --jobs "$jobs" $prefetch | tee -a "$out"
    # W1's 20 slots and the 11 the gate's and the key's steps hold (cli/src/w5.rs).
    "$cli" workload w5 --jobs "$jobs" --backlog "$backlog" --concurrency 31 ${nodes:+--nodes "$nodes"} $prefetch | tee -a "$out"
    # With several nodes, the same nodes without the backlogs: W1 on as many
    # processes, the baseline the backlogs' cost shows against.
    if [ -n "$nodes" ]; then
        "$cli" workload w5 --jobs "$jobs" --backlog 0 --hold 0 --concurrency 31 --nodes "$nodes" $prefetch | tee -a "$out"
    fi
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
floor = [r for r in runs if r["workload"] == "commit"]
runs = [r for r in runs if r not in floor]
base = [r for r in runs if r["workload"] == "w5" and r["backlog"] == 0]
runs = [r for r in runs if r not in base]
med = lambda w, k: statistics.median(r[k] for r in runs if r["workload"] == w)
w1, w5 = med("w1", "jobs_per_s"), med("w5", "jobs_per_s")
if base:
    b = statistics.median(r["jobs_per_s"] for r in base)
    print(f"{base[0]['nodes']} nodes without backlogs {b:,.0f} jobs/s; with them {w5 / b:.2f} of that")
print(f"W1 {w1:,.0f} jobs/s; W5 {w5:,.0f} jobs/s = {w5 / w1:.2f} of W1; "
      f"claiming-call p99 W1 {med('w1', 'pick_p99_ms'):.1f} ms, W5 {med('w5', 'pick_p99_ms'):.1f} ms, "
      f"W5 holding {med('w5', 'pick_p99_hold_ms'):.1f} ms (the highest node's; every node's calls as one "
      f"{med('w5', 'pick_p99_hold_all_ms'):.1f} ms); meanwhile per second: "
      f"gate {med('w5', 'gate_per_s'):.1f} (limit 10), K = 1 key {med('w5', 'key_per_s'):.2f} (1), "
      f"rate limit {med('w5', 'rate_per_s'):.1f} (50)")
print(f"a one-row commit alone on this server: p50 {statistics.median(r['commit_p50_ms'] for r in floor):.2f} ms, "
      f"p99 {statistics.median(r['commit_p99_ms'] for r in floor):.2f} ms (the floor of any claiming call)")
PY
rm -f "$out"
