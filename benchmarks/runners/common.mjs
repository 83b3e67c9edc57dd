// What the Node runners share (the same contract as common.py): the command
// line, the workloads' shapes, the per-job records, the JSON line and W5's course.
import { writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

export { sleep };
export const DEFAULT_JOBS = { w1: 20000, w2: 10000, w3: 2000, w4: 500, w5: 20000 };
export const KEYS = 100; // W2: one at a time per key
export const GATE = 10; // W3: at most 10 at once
export const PAUSE = { w1: 0, w2: 5, w3: 20, w4: 0, w5: 0 }; // ms each job sleeps (W5: by kind)
// W5: the kinds of rows in the order they are inserted, their limits, and the
// gate's and the key's step length (rate and free steps are no-ops).
export const W5 = { kinds: ["gate", "key", "rate", "free"], gate: 10, key: 1, rate: 50, pauseMs: 1000 };

// CLOCK_REALTIME in nanoseconds, at sub-millisecond resolution.
const origin = BigInt(Date.now()) * 1000000n - process.hrtime.bigint();
export const nowNs = () => origin + process.hrtime.bigint();

export function parseArgs(system) {
  const argv = process.argv.slice(2);
  const args = { system, workload: argv[0], concurrency: 20, jobs: 0, record: null, backlog: 1000000, hold: 10 };
  for (let i = 1; i < argv.length; i += 2) args[argv[i].replace(/^--/, "")] = argv[i + 1];
  if (!(args.workload in DEFAULT_JOBS)) throw new Error(`unknown workload ${args.workload}`);
  args.concurrency = Number(args.concurrency);
  args.jobs = Number(args.jobs) || DEFAULT_JOBS[args.workload];
  args.backlog = Number(args.backlog);
  args.hold = Number(args.hold);
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

// W5's records: a start is kept when the job starts, so that a job still running
// when the worker stops is recorded too (ending when the records are written).
export class Spans {
  starts = [];
  ends = [];
  done = { gate: 0, key: 0, rate: 0, free: 0 };
  start(kind) {
    this.starts.push([kind, nowNs()]);
    return this.starts.length - 1;
  }
  end(i) {
    this.ends[i] = nowNs();
    this.done[this.starts[i][0]]++;
  }
  write(path) {
    if (!path) return;
    const last = nowNs();
    writeFileSync(path, this.starts.map(([k, s], i) => `${k},${s},${this.ends[i] ?? last}\n`).join(""));
  }
  perSecond(kind, t0, t1) {
    const n = this.starts.filter(([k, s]) => k === kind && s >= t0 && s <= t1).length;
    return n / (Number(t1 - t0) / 1e9);
  }
}

// W5's course, the same for every runner: insert the kinds in `supported` in
// batches of `chunk` (`insert(kind, n)`), `prepare()` if given (before the
// clock), start the worker, time the free rows until the system's own tables
// show none left (`freeLeft()`), hold, stop.
export async function w5(args, spans, supported, { insert, prepare, startWorker, freeLeft, stopWorker, chunk }) {
  const rows = { gate: args.backlog, key: args.backlog, rate: Math.floor(args.backlog / 10), free: args.jobs };
  for (const kind of W5.kinds) {
    if (!supported.has(kind)) continue;
    const total = rows[kind];
    const t0 = performance.now();
    let last = 0;
    for (let at = 0; at < total; at += chunk) {
      const n = Math.min(chunk, total - at);
      await insert(kind, n);
      const now = performance.now();
      if (at + n >= total || now - last >= 1000) {
        last = now;
        const rate = Math.round((at + n) / ((now - t0) / 1000));
        console.error(`insert ${kind.padEnd(4)} ${at + n}/${total} (${rate}/s)`);
      }
    }
  }
  if (prepare) await prepare();
  const t = performance.now();
  const t0 = nowNs();
  await startWorker();
  await waitUntil(() => spans.done.free >= args.jobs);
  await waitUntil(async () => (await freeLeft()) === 0, 5);
  const seconds = (performance.now() - t) / 1000;
  console.error(`w5: ${args.jobs} free jobs in ${seconds.toFixed(2)} s; holding ${args.hold} s`);
  await sleep(args.hold * 1000);
  const t1 = nowNs();
  await stopWorker();
  spans.write(args.record);
  const rate = (kind) => (supported.has(kind) ? spans.perSecond(kind, t0, t1) : null);
  emit(args, seconds, { backlog: args.backlog, gate_per_s: rate("gate"), key_per_s: rate("key"), rate_per_s: rate("rate") });
}
