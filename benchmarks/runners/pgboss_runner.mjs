// pg-boss runner: W2 keys are pg-boss groups with groupConcurrency 1, W3 one
// group with groupConcurrency 10 (both tracked in the database, across nodes).
// W5: the gate is a group of the tier "gate" (groupConcurrency tiers: 10), the
// key a group of the default tier (1); pg-boss has no rate limit on starts
// (its singletonSeconds throttles sends, one job per time slot), so no rate rows.
import { PgBoss } from "pg-boss";
import pg from "pg";
import {
  GATE, PAUSE, Records, Spans, W5, emit, keyOf, latencies, nowNs, pacedInserts, parseArgs, sleep, w5, waitUntil,
} from "./common.mjs";

const args = parseArgs("pg-boss");
const connectionString = process.env.DATABASE_URL;
const QUEUE = "jobs";
// pg-boss runs `localConcurrency` polling workers, each handling a batch of up to
// `batchSize` jobs: 2 x 10 keeps 20 jobs in flight. A worker whose fetch came
// back full fetches again at once (burstWhenBatchFull); otherwise it waits for a
// NOTIFY or the shortest polling interval pg-boss accepts (0.5 s).
const BATCH = 10;
// W5: the queue cache (where a worker reads the ready count for burstWhenReadyExceeds)
// is read every second instead of every minute.
const w5Cache = args.workload === "w5" ? { queueCacheIntervalSeconds: 1 } : {};
const boss = new PgBoss({ connectionString, useListenNotify: true, max: args.concurrency + 4, ...w5Cache });
boss.on("error", (e) => console.error(e));
await boss.start();
await boss.createQueue(QUEUE, { notify: true });

if (args.workload === "w5") {
  const spans = new Spans();
  const client = new pg.Client({ connectionString });
  await client.connect();
  const groups = { gate: { id: "api", tier: "gate" }, key: { id: "acct:1" } };
  let freeAfter = null;
  await w5(args, spans, new Set(["gate", "key", "free"]), {
    chunk: 5000,
    insert: async (kind, n) => {
      if (kind === "free" && freeAfter === null) {
        // The free rows are the last created (uuid ids say nothing of order).
        const sql = "SELECT max(created_on)::text AS t FROM pgboss.job WHERE name = $1";
        freeAfter = (await client.query(sql, [QUEUE])).rows[0].t;
      }
      const job = { data: { k: kind }, ...(groups[kind] ? { group: groups[kind] } : {}) };
      await boss.insert(QUEUE, Array.from({ length: n }, () => job));
    },
    // A batch is completed together, so a 1 s job would hold the rest of its
    // batch (2 x 10 batches ran 500 free jobs in over 3 minutes behind 5,000-row
    // backlogs): 20 workers fetching one job each keep 20 in flight instead.
    // At batchSize 1 only burstWhenReadyExceeds makes a worker fetch again at once
    // (otherwise it waits for a NOTIFY, or 30 s); it reads the queue's ready count
    // from the stats cache, so the count is refreshed once after the inserts,
    // before the clock starts.
    prepare: async () => {
      await boss.getQueueStats(QUEUE, { force: true });
      await sleep(1500); // the queue cache's next read
    },
    startWorker: async () => {
      await boss.work(
        QUEUE,
        {
          batchSize: 1,
          localConcurrency: args.concurrency,
          burstWhenReadyExceeds: 1,
          pollingIntervalSeconds: 0.5,
          groupConcurrency: { default: W5.key, tiers: { gate: W5.gate } },
        },
        async ([job]) => {
          const i = spans.start(job.data.k);
          if (job.data.k !== "free") await sleep(W5.pauseMs);
          spans.end(i);
        },
      );
    },
    freeLeft: async () => {
      const sql =
        "SELECT count(*) AS n FROM pgboss.job WHERE name = $1 AND created_on > $2::timestamptz" +
        " AND state IN ('created', 'retry', 'active')";
      return Number((await client.query(sql, [QUEUE, freeAfter ?? "-infinity"])).rows[0].n);
    },
    stopWorker: () => boss.stop({ graceful: true, wait: true }),
  });
  await client.end();
  process.exit(0);
}

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
  // Fresh statistics after the bulk insert, before the clock, as PostgreSQL
  // advises after a bulk load (every runner does: benchmarks/README.md, Results).
  await client.query("ANALYZE pgboss.job");
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
