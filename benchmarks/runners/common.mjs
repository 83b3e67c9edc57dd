// What the Node runners share (the same contract as common.py): the command
// line, the workloads' shapes, the per-job records and the JSON line.
import { writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

export { sleep };
export const DEFAULT_JOBS = { w1: 20000, w2: 10000, w3: 2000, w4: 500 };
export const KEYS = 100; // W2: one at a time per key
export const GATE = 10; // W3: at most 10 at once
export const PAUSE = { w1: 0, w2: 5, w3: 20, w4: 0 }; // ms each job sleeps

// CLOCK_REALTIME in nanoseconds, at sub-millisecond resolution.
const origin = BigInt(Date.now()) * 1000000n - process.hrtime.bigint();
export const nowNs = () => origin + process.hrtime.bigint();

export function parseArgs(system) {
  const argv = process.argv.slice(2);
  const args = { system, workload: argv[0], concurrency: 20, jobs: 0, record: null };
  for (let i = 1; i < argv.length; i += 2) args[argv[i].replace(/^--/, "")] = argv[i + 1];
  if (!(args.workload in DEFAULT_JOBS)) throw new Error(`unknown workload ${args.workload}`);
  args.concurrency = Number(args.concurrency);
  args.jobs = Number(args.jobs) || DEFAULT_JOBS[args.workload];
  return args;
}

export function keyOf(workload, i) {
  if (workload === "w2") return `k${i % KEYS}`;
  if (workload === "w3") return "api";
  return null;
}

// Kept in memory, written once at the end.
export class Records {
  rows = [];
  add(key, start, end) {
    this.rows.push(`${key ?? ""},${start},${end}\n`);
  }
  write(path) {
    if (path) writeFileSync(path, this.rows.join(""));
  }
}

export function emit(args, seconds, extra = {}) {
  const line = { system: args.system, workload: args.workload, jobs: args.jobs, seconds };
  line.jobs_per_s = args.jobs / seconds;
  console.log(JSON.stringify({ ...line, ...extra }));
}

export function unsupported(args, reason) {
  console.log(JSON.stringify({ system: args.system, workload: args.workload, unsupported: reason }));
  process.exit(0);
}

// W4: insert one job every 20 ms; returns the time taken just before each insert.
export async function pacedInserts(n, insertOne) {
  const before = [];
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const delay = t0 + i * 20 - performance.now();
    if (delay > 0) await sleep(delay);
    before.push(nowNs());
    await insertOne(i);
  }
  return before;
}

export function latencies(before, started) {
  const ms = before.filter((_, i) => started.has(i)).map((t, i) => Number(started.get(i) - t) / 1e6);
  ms.sort((a, b) => a - b);
  const pick = (p) => ms[Math.min(Math.floor(ms.length * p), ms.length - 1)];
  return { p50_ms: pick(0.5), p99_ms: pick(0.99) };
}

export async function waitUntil(predicate, ms = 2) {
  while (!(await predicate())) await sleep(ms);
}
