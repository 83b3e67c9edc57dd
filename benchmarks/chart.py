"""Draws results.json as a bar chart: jobs/s for W1-W3, W5 and the raw loop,
and latency for W4. Run by the harness with the work folder's matplotlib."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OURS = {"gendurable", "gendurable-py", "gendurable-ex"}
TITLES = {
    "w1": "W1: no-op jobs, no keys (jobs/s)",
    "w2": "W2: 100 keys, one at a time, 5 ms (jobs/s; ideal 4,000)",
    "w3": "W3: one key, 10 at once, 20 ms (jobs/s; ideal 500)",
    "w4": "W4: insert-to-start latency at 50/s (ms; p50 bar, p99 tick)",
    "w5": "W5: unrelated no-op jobs behind blocked backlogs (jobs/s)",
}


def colour(system: str) -> str:
    if system in OURS:
        return "#2a7ab9"
    return "#999999" if system == "raw" else "#e08a2c"


def main(src: str, dst: str) -> None:
    doc = json.load(open(src))
    ok = [r for r in doc["results"] if r.get("status") == "ok"]
    raw = [r for r in ok if r["workload"] == "raw"]
    panels = [w for w in TITLES if any(r["workload"] == w for r in doc["results"])]
    if not panels:
        print("chart: no workload to draw", file=sys.stderr)
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 + 1.9 * len(panels)), squeeze=False)
    for ax, w in zip(axes[:, 0], panels, strict=True):
        rows = [r for r in doc["results"] if r["workload"] == w]
        if w == "w1":
            rows += raw
        labels = [r["label"] for r in rows]
        if w == "w4":
            vals = [r.get("p50_ms") or 0 for r in rows]
            ax.barh(labels, vals, color=[colour(r["system"]) for r in rows])
            ax.scatter([r.get("p99_ms") or 0 for r in rows], labels, marker="|", s=200, color="black")
            ax.set_xscale("log")
        else:
            vals = [r.get("jobs_per_s") or 0 for r in rows]
            ax.barh(labels, vals, color=[colour(r["system"]) for r in rows])
        for y, r in enumerate(rows):
            if r.get("status") != "ok":
                ax.text(0, y, "  " + r["status"], va="center", fontsize=8, color="#b00")
            elif r.get("violations"):
                ax.text(vals[y], y, f"  {r['violations']} violations", va="center", fontsize=8, color="#b00")
        ax.invert_yaxis()
        ax.set_title(TITLES[w], fontsize=10, loc="left")
        ax.tick_params(labelsize=8)
    v = doc["versions"]
    fig.suptitle(
        f"worker concurrency {doc['concurrency']}, scale {doc['scale']}, {v.get('postgresql', '')}, fsync on",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=80)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
