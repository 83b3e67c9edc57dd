// graphile-worker runner: W2 keys are named queues (jobs sharing a queue_name
// run one at a time, enforced in the database). It has no limit above one per
// queue, so W3 is reported unsupported. W5: the key is a named queue; there is
// no limit above one per queue and no rate limit, so no gate or rate rows.
import { spawn } from "node:child_process";
import { readFileSync, appendFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Logger, makeWorkerUtils, run } from "graphile-worker";
import pg from "pg";
import {
  PAUSE, Records, Spans, W5, emit, keyOf, latencies, nowNs, pacedInserts, parseArgs, sleep, unsupported, w5,
  waitUntil,
} from "./common.mjs";

const args = parseArgs("graphile-worker");
if (args.workload === "w3") unsupported(args, "no concurrency limit above 1 per key (queue_name = one at a time)");
const connectionString = process.env.DATABASE_URL;
// Only warnings and errors: the default logger writes a line per job.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});
const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();

// The documented batching options: a local queue fetches jobs in batches, and
// completions are written together (0 ms: whatever finished meanwhile).
const workerOptions = (taskList) => ({
  connectionString,
  concurrency: args.concurrency,
  noHandleSignals: true,
  logger,
  pollInterval: 100,
  maxPoolSize: args.concurrency + 4,
  taskList,
  preset: { worker: { localQueue: { size: 4 * args.concurrency }, completeJobBatchDelay: 0 } },
});

if (args.workload === "w5") {
  const spans = new Spans();
  const taskList = {
    key: async () => {
      const i = spans.start("key");
      await sleep(W5.pauseMs);
      spans.end(i);
    },
    free: async () => {
      spans.end(spans.start("free"));
    },
  };
  const client = new pg.Client({ connectionString });
  await client.connect();
  let firstFree = null, runner = null;
  await w5(args, spans, new Set(["key", "free"]), {
    chunk: 5000,
    insert: async (kind, n) => {
      const spec = kind === "key" ? { identifier: "key", payload: {}, queueName: "acct:1" } : { identifier: "free", payload: {} };
      const jobs = await utils.addJobs(Array.from({ length: n }, () => spec));
      if (kind === "free" && firstFree === null) firstFree = jobs.map((j) => BigInt(j.id)).reduce((a, b) => (a < b ? a : b));
    },
    startWorker: async () => {
      runner = await run(workerOptions(taskList));
    },
    // Done rows are deleted; the free rows are the last ids.
    freeLeft: async () =>
      Number((await client.query("SELECT count(*) AS n FROM graphile_worker._private_jobs WHERE id >= $1", [String(firstFree)])).rows[0].n),
    stopWorker: async () => {
      await runner.stop();
    },
  });
  await utils.release();
  await client.end();
  process.exit(0);
}

const records = new Records();
const started = new Map();
let done = 0;
const pause = PAUSE[args.workload];
const taskList = {
  job: async (payload) => {
    const start = nowNs();
    if (pause) await sleep(pause);
    started.set(payload.i, start);
    records.add(keyOf(args.workload, payload.i), start, nowNs());
    done++;
  },
};

const client = new pg.Client({ connectionString });
await client.connect();
// Completed jobs are deleted; the clock stops when none is left.
const remaining = async () =>
  Number((await client.query("SELECT count(*) AS n FROM graphile_worker._private_jobs")).rows[0].n);
const drained = () => waitUntil(async () => (await remaining()) === 0, 5);
const finished = async () => {
  await waitUntil(() => done >= args.jobs);
  await drained();
};
// Stops the worker and writes this process's records.
const close = async (runner) => {
  await runner.stop();
  await utils.release();
  await client.end();
  records.write(args.record);
};

const startWorker = () => run(workerOptions(taskList));

const spec = (i) => {
  const s = { identifier: "job", payload: { i } };
  const key = keyOf(args.workload, i);
  if (key) s.queueName = key;
  return s;
};
const insertAll = async () => {
  for (let i = 0; i < args.jobs; i += 5000) {
    await utils.addJobs(Array.from({ length: Math.min(5000, args.jobs - i) }, (_, k) => spec(i + k)));
  }
};
// Fresh statistics after the insert, before the clock, as PostgreSQL advises
// after a bulk load (and gendurable's runner does): graphile-worker's job
// fetch, planned on a table last analyzed empty, ran W1 at 17,000 jobs/s over
// 20,000 jobs and 5,600 over 100,000, against 32,000 and 33,000 after it.
const analyze = () => client.query("ANALYZE graphile_worker._private_jobs");

// `--nodes N` (W1, W2; benchmarks/nodes): after the insert this process starts
// N - 1 more worker processes (`--worker 1`), as gendurable's first node starts
// the others, and works beside them until no job is left; each reports how
// many it ran and writes its records beside this one's.
const nodes = Number(args.nodes ?? 1);
if (args.worker === "1") {
  const runner = await startWorker();
  // Its count every 10 ms to the first process, which sums them: counting
  // the jobs table as often would cost the server a scan each time.
  // It ends when the table is empty, which the first process times: it
  // looks only every 100 ms.
  const progress = setInterval(() => console.log(`progress ${done}`), 10);
  await waitUntil(async () => (await remaining()) === 0, 100);
  clearInterval(progress);
  await close(runner);
  console.log(JSON.stringify({ done }));
  process.exit(0);
}

function extraWorker(k) {
  const argv = [fileURLToPath(import.meta.url), args.workload, "--concurrency", String(args.concurrency),
    "--jobs", String(args.jobs), "--worker", "1"];
  if (args.record) argv.push("--record", `${args.record}.${k}`);
  const child = spawn(process.execPath, argv, { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => {
    out += d;
    const lines = out.split("\n");
    out = lines.pop();
    for (const line of lines) {
      if (line.startsWith("progress ")) progressOf[k] = Number(line.slice(9));
      else if (line.trim()) last[k] = line;
    }
  });
  return new Promise((resolve, reject) =>
    child.on("exit", (code) => (code === 0 ? resolve(JSON.parse((last[k] ?? out).trim()).done) : reject(new Error(`worker ${k} exited with ${code}`)))),
  );
}
// What the other worker processes said last: their progress, and their final line.
const progressOf = {};
const last = {};

let runner, t, extra = {};
if (args.nodes !== undefined) {
  if (args.workload !== "w1" && args.workload !== "w2") unsupported(args, "--nodes runs W1 and W2");
  await insertAll();
  await analyze();
  t = performance.now();
  const others = Array.from({ length: nodes - 1 }, (_, k) => extraWorker(k + 1));
  runner = await startWorker();
  // As gendurable's first node does (cli/src/workload.rs, Pace): when a tenth
  // and nine tenths of the jobs were done; the rate between the two is the
  // steady one, and the start costs the time to the first tenth beyond what
  // that rate would have taken.
  // The jobs run are counted in the processes (this one's and what the
  // others last said); the table is counted once they add up.
  const marks = {};
  await waitUntil(() => {
    const finished = Object.values(progressOf).reduce((a, b) => a + b, done);
    const at = performance.now() - t;
    if (marks.tenth === undefined && finished * 10 >= args.jobs) marks.tenth = at;
    if (marks.nine === undefined && finished * 10 >= args.jobs * 9) marks.nine = at;
    return finished >= args.jobs;
  }, 2);
  await drained();
  const seconds = (performance.now() - t) / 1000;
  await close(runner);
  const counts = [done, ...(await Promise.all(others))];
  const total = counts.reduce((a, b) => a + b, 0);
  for (let k = 1; k < nodes && args.record; k++) appendFileSync(args.record, readFileSync(`${args.record}.${k}`));
  const pace = {};
  if (marks.nine > marks.tenth) {
    pace.steady_jobs_per_s = (0.8 * args.jobs) / ((marks.nine - marks.tenth) / 1000);
    pace.ramp_ms = Math.max(0, marks.tenth - (0.1 * args.jobs * 1000) / pace.steady_jobs_per_s);
  }
  emit(args, seconds, { nodes, shares: counts.map((c) => c / total), ...pace });
  process.exit(0);
} else if (args.workload === "w4") {
  runner = await startWorker();
  await sleep(1000); // idle and listening
  t = performance.now();
  const before = await pacedInserts(args.jobs, (i) => utils.addJobs([spec(i)]));
  await finished();
  extra = latencies(before, started);
} else {
  t = performance.now();
  await insertAll();
  if (args.workload === "w1") extra = { insert_per_s: args.jobs / ((performance.now() - t) / 1000) };
  await analyze();
  t = performance.now();
  runner = await startWorker();
  await finished();
}
const seconds = (performance.now() - t) / 1000;
await close(runner);
emit(args, seconds, extra);
process.exit(0); // the worker library may leave timers behind
