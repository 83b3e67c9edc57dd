// pg-boss runner: W2 keys are pg-boss groups with groupConcurrency 1, W3 one
// group with groupConcurrency 10 (both tracked in the database, across nodes).
import { PgBoss } from "pg-boss";
import pg from "pg";
import {
  GATE, PAUSE, Records, emit, keyOf, latencies, nowNs, pacedInserts, parseArgs, sleep, waitUntil,
} from "./common.mjs";

const args = parseArgs("pg-boss");
const connectionString = process.env.DATABASE_URL;
const QUEUE = "jobs";
// pg-boss runs `localConcurrency` polling workers, each handling a batch of up to
// `batchSize` jobs: 2 x 10 keeps 20 jobs in flight. A worker whose fetch came
// back full fetches again at once (burstWhenBatchFull); otherwise it waits for a
// NOTIFY or the shortest polling interval pg-boss accepts (0.5 s).
const BATCH = 10;
const boss = new PgBoss({ connectionString, useListenNotify: true, max: args.concurrency + 4 });
boss.on("error", (e) => console.error(e));
await boss.start();
await boss.createQueue(QUEUE, { notify: true });

const records = new Records();
const started = new Map();
let done = 0;
const pause = PAUSE[args.workload];
const handle = async (job) => {
  const start = nowNs();
  if (pause) await sleep(pause);
  started.set(job.data.i, start);
  records.add(keyOf(args.workload, job.data.i), start, nowNs());
  done++;
};

const client = new pg.Client({ connectionString });
await client.connect();
const remaining = async () =>
  Number(
    (await client.query("SELECT count(*) AS n FROM pgboss.job WHERE state IN ('created', 'retry', 'active')"))
      .rows[0].n,
  );
const finished = async () => {
  await waitUntil(() => done >= args.jobs);
  await waitUntil(async () => (await remaining()) === 0, 5);
};

const groupLimit = { w2: 1, w3: GATE }[args.workload];
const startWorker = () =>
  boss.work(
    QUEUE,
    {
      batchSize: BATCH,
      localConcurrency: Math.max(1, Math.round(args.concurrency / BATCH)),
      burstWhenBatchFull: true,
      pollingIntervalSeconds: 0.5,
      ...(groupLimit ? { groupConcurrency: groupLimit } : {}),
    },
    (jobs) => Promise.all(jobs.map(handle)),
  );

const job = (i) => {
  const j = { data: { i } };
  const key = keyOf(args.workload, i);
  if (key) j.group = { id: key };
  return j;
};

let t, extra = {};
if (args.workload === "w4") {
  await startWorker();
  await sleep(1000); // idle and listening
  t = performance.now();
  const before = await pacedInserts(args.jobs, (i) => boss.send(QUEUE, { i }));
  await finished();
  extra = latencies(before, started);
} else {
  t = performance.now();
  for (let i = 0; i < args.jobs; i += 5000) {
    await boss.insert(QUEUE, Array.from({ length: Math.min(5000, args.jobs - i) }, (_, k) => job(i + k)));
  }
  if (args.workload === "w1") extra = { insert_per_s: args.jobs / ((performance.now() - t) / 1000) };
  t = performance.now();
  await startWorker();
  await finished();
}
const seconds = (performance.now() - t) / 1000;
await boss.stop({ graceful: true, wait: true });
await client.end();
records.write(args.record);
emit(args, seconds, extra);
process.exit(0); // the worker library may leave timers behind
