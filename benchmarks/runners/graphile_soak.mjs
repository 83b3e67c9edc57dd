// graphile-worker's side of the soak (benchmarks/soak_peer; ours is cli/src/soak.rs):
// jobs inserted at a steady `--rate` per second for `--minutes` while one worker
// process (concurrency 20, the harness's W1 settings) runs them, sampled every 10 s.
//
// The mix, job i of the inserts (i from 1), as in cli/src/soak.rs:
//   i % 20 in 0..3  20 %  queueName `account:${i % 1000}`: a named queue runs one
//                         job at a time, graphile's K = 1 key
//   i % 20 == 4      5 %  the "gate of 50": graphile-worker has no limit above one
//                         per queue, so these run as plain jobs (counted apart)
//   i % 20 == 5      5 %  fail their first attempt and are retried (graphile's own
//                         backoff: the retry is due exp(1) = 2.7 s later; ours 10-50 ms)
//   otherwise       70 %  no-op jobs
//
// No history: graphile-worker deletes a job when it completes, so it keeps no
// finished rows and has nothing to prune; the table starts empty.
//
// A sample every 10 s: completed/s, inserted/s, the p99 of the worker's batch
// fetch (the get_job query, timed around its round trip on the worker's pool),
// the p99 of the start latency (a job's start minus its run_at), the backlog
// (jobs that could start now: not locked, due, and at most one per named queue
// that is not locked), every row still waiting (`queued`), the jobs table's and
// its indexes' size, its dead and live rows, autovacuum runs, the job queues
// table, and this process's RSS (worker and inserter, as our node is both).
// Samples go to stderr as `soak {...}`, the result as one JSON object to stdout.
//
//   DATABASE_URL=... node graphile_soak.mjs --minutes 30 --rate 7000 [--concurrency 20] [--tuned-autovacuum 1]
import { Logger, makeWorkerUtils, run } from "graphile-worker";
import { readFileSync } from "node:fs";
import pg from "pg";
import { sleep } from "./common.mjs";

const argv = process.argv.slice(2);
const args = { minutes: 30, rate: 0, concurrency: 20, "tuned-autovacuum": 0 };
for (let i = 0; i < argv.length; i += 2) args[argv[i].replace(/^--/, "")] = Number(argv[i + 1]);
if (!(args.rate > 0 && args.minutes > 0)) throw new Error("the soak needs --rate and --minutes above zero");
const connectionString = process.env.DATABASE_URL;
const SAMPLE_MS = 10_000;
const TICK_MS = 50;
const FAIL = "the first attempt fails";
const KINDS = ["noop", "key", "gate", "retry"];

// Warnings and errors only (the default logger writes a line per job), less
// the planned first-attempt failures, which are counted instead.
let failureLines = 0;
const logger = new Logger(() => (level, message) => {
  if (message.includes(FAIL)) failureLines++;
  else if (level === "error" || level === "warning") console.error(message);
});
const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
// `--tuned-autovacuum 1`: the jobs table gets the per-table autovacuum settings
// gendurable's migration gives its own (core/sql/migrations/*_autovacuum.sql);
// by default it keeps PostgreSQL's, as graphile-worker ships it.
const AUTOVACUUM = `autovacuum_vacuum_cost_delay = 0, autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02`;
if (args["tuned-autovacuum"]) {
  await utils.withPgClient(async (c) => {
    await c.query(`ALTER TABLE graphile_worker._private_jobs SET (${AUTOVACUUM})`);
    await c.query("ALTER TABLE graphile_worker._private_job_queues SET (autovacuum_vacuum_cost_delay = 0)");
  });
}

// The worker's pool, as graphile would make it from connectionString with
// maxPoolSize (the harness's settings), but ours so that the fetch can be timed.
const fetches = [];
const pool = new pg.Pool({ connectionString, max: args.concurrency + 4 });
pool.on("error", (e) => console.error(`idle client: ${e.message}`));
pool.on("connect", (client) => {
  client.on("error", (e) => console.error(`client: ${e.message}`));
  const query = client.query.bind(client);
  client.query = (config, ...rest) => {
    const timed = config && typeof config === "object" && String(config.name ?? config.text).startsWith("get_job");
    if (!timed || rest.length > 0) return query(config, ...rest);
    const t = performance.now();
    const p = query(config);
    p.then(
      () => fetches.push(performance.now() - t),
      () => {},
    );
    return p;
  };
});

const completed = Object.fromEntries(KINDS.map((k) => [k, 0]));
let done = 0;
let failedAttempts = 0;
const starts = [];
const taskList = {
  job: async (payload, helpers) => {
    starts.push(Date.now() - helpers.job.run_at.getTime());
    if (payload.fail && helpers.job.attempts === 1) {
      failedAttempts++;
      throw new Error(FAIL);
    }
    completed[payload.k]++;
    done++;
  },
};

function job(i) {
  const r = i % 20;
  if (r <= 3) return { identifier: "job", payload: { k: "key" }, queueName: `account:${i % 1000}` };
  if (r === 4) return { identifier: "job", payload: { k: "gate" } };
  if (r === 5) return { identifier: "job", payload: { k: "retry", fail: true } };
  return { identifier: "job", payload: { k: "noop" } };
}

const sampler = new pg.Client({ connectionString });
await sampler.connect();
const rows = async (text) => (await sampler.query(text)).rows;
const mb = (b) => Number(b) / 1048576;
const indexSizes = async () =>
  Object.fromEntries(
    (
      await rows(`SELECT indexrelname::text AS name, pg_relation_size(indexrelid) AS bytes
                  FROM pg_stat_user_indexes WHERE schemaname = 'graphile_worker' AND relname = '_private_jobs'
                  ORDER BY 2 DESC`)
    ).map((r) => [r.name, mb(r.bytes)]),
  );

function p99(xs) {
  if (xs.length === 0) return null;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(Math.floor(s.length * 0.99), s.length - 1)];
}

async function sample(t, dt, completedNow, insertedNow) {
  const [r] = await rows(`
    SELECT pg_table_size('graphile_worker._private_jobs') AS table_bytes,
           pg_indexes_size('graphile_worker._private_jobs') AS index_bytes,
           coalesce(n_dead_tup, 0) AS dead, coalesce(n_live_tup, 0) AS live,
           coalesce(autovacuum_count, 0) AS autovacuums,
           pg_total_relation_size('graphile_worker._private_job_queues') AS queues_bytes,
           (SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables
             WHERE schemaname = 'graphile_worker' AND relname = '_private_job_queues') AS queues_dead,
           (SELECT count(*) FILTER (WHERE j.job_queue_id IS NULL)
                   + count(DISTINCT j.job_queue_id) FILTER (WHERE q.is_available)
              FROM graphile_worker._private_jobs j
              LEFT JOIN graphile_worker._private_job_queues q ON q.id = j.job_queue_id
             WHERE j.is_available AND j.run_at <= now()) AS backlog,
           (SELECT count(*) FROM graphile_worker._private_jobs WHERE locked_at IS NULL) AS queued
      FROM pg_stat_user_tables WHERE schemaname = 'graphile_worker' AND relname = '_private_jobs'`);
  const s = {
    t,
    inserted_per_s: insertedNow / dt,
    completed_per_s: completedNow / dt,
    fetch_p99_ms: p99(fetches.splice(0)),
    start_p99_ms: p99(starts.splice(0)),
    backlog: Number(r.backlog),
    queued: Number(r.queued),
    table_mb: mb(r.table_bytes),
    indexes_mb: mb(r.index_bytes),
    dead_rows: Number(r.dead),
    live_rows: Number(r.live),
    autovacuums: Number(r.autovacuums),
    queues_mb: mb(r.queues_bytes),
    queues_dead_rows: Number(r.queues_dead),
    rss_mb: process.memoryUsage.rss() / 1048576,
  };
  console.error(`soak ${JSON.stringify(s)}`);
  return s;
}

// The harness's W1 settings (runners/graphile_runner.mjs): batch fetching into
// a local queue of 4 x concurrency, completions written together.
const runner = await run({
  pgPool: pool,
  concurrency: args.concurrency,
  noHandleSignals: true,
  logger,
  pollInterval: 100,
  taskList,
  preset: { worker: { localQueue: { size: 4 * args.concurrency }, completeJobBatchDelay: 0 } },
});
const indexesAtStart = await indexSizes();
const [{ reloptions }] = await rows(
  "SELECT reloptions FROM pg_class WHERE oid = 'graphile_worker._private_jobs'::regclass",
);
const t0 = performance.now();
const end = t0 + args.minutes * 60_000;

// Inserts what is due every 50 ms; a tick that runs late inserts more.
const inserted = Object.fromEntries(KINDS.map((k) => [k, 0]));
let sent = 0;
const inserter = (async () => {
  let i = 0;
  for (let next = t0; performance.now() < end; ) {
    next += TICK_MS;
    const wait = next - performance.now();
    if (wait > 0) await sleep(wait);
    else next = performance.now();
    const due = Math.floor((args.rate * (performance.now() - t0)) / 1000);
    const batch = [];
    while (sent + batch.length < due) batch.push(job(++i));
    if (batch.length === 0) continue;
    await utils.addJobs(batch);
    for (const b of batch) inserted[b.payload.k]++;
    sent += batch.length;
  }
})();

const samples = [];
let last = { at: t0, done: 0, sent: 0 };
for (let next = t0 + SAMPLE_MS; next <= end; next += SAMPLE_MS) {
  await sleep(Math.max(0, next - performance.now()));
  const at = performance.now();
  const now = { at, done, sent };
  samples.push(await sample((at - t0) / 1000, (at - last.at) / 1000, now.done - last.done, now.sent - last.sent));
  last = now;
}
await inserter;
await runner.stop();
const indexesAtEnd = await indexSizes();

const total = args.minutes * 60;
const window = (from, to) => samples.filter((s) => s.t > from && s.t <= to);
const [first, lastFive] = [window(0, 300), window(total - 300, total)];
const mean = (ss, key) => {
  const xs = ss.map((s) => s[key]).filter((x) => x !== null);
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
};
const max = (key) => Math.max(0, ...samples.map((s) => s[key]));
// The package exports only its index: read its package.json beside this file (the work folder).
const version = JSON.parse(
  readFileSync(new URL("./node_modules/graphile-worker/package.json", import.meta.url), "utf8"),
).version;
console.log(
  JSON.stringify({
    system: "graphile-worker",
    version,
    workload: "soak",
    process: "worker process",
    minutes: args.minutes,
    rate: args.rate,
    concurrency: args.concurrency,
    history: 0,
    table_autovacuum: args["tuned-autovacuum"] ? "tuned (gendurable's per-table settings)" : "defaults",
    jobs_table_reloptions: reloptions,
    retention_s: null,
    inserted: sent,
    inserted_by_kind: inserted,
    completed_by_kind: completed,
    failed_first_attempts: failedAttempts,
    failure_log_lines: failureLines,
    first5_completed_per_s: mean(first, "completed_per_s"),
    last5_completed_per_s: mean(lastFive, "completed_per_s"),
    first5_fetch_p99_ms: mean(first, "fetch_p99_ms"),
    last5_fetch_p99_ms: mean(lastFive, "fetch_p99_ms"),
    first5_start_p99_ms: mean(first, "start_p99_ms"),
    last5_start_p99_ms: mean(lastFive, "start_p99_ms"),
    table_mb_first: samples[0]?.table_mb ?? null,
    table_mb_max: max("table_mb"),
    table_mb_last: samples.at(-1)?.table_mb ?? null,
    indexes_mb_first: samples[0]?.indexes_mb ?? null,
    indexes_mb_max: max("indexes_mb"),
    indexes_mb_last: samples.at(-1)?.indexes_mb ?? null,
    rss_mb_first5: mean(first, "rss_mb"),
    rss_mb_last5: mean(lastFive, "rss_mb"),
    backlog_last: samples.at(-1)?.backlog ?? null,
    index_mb_at_start: indexesAtStart,
    index_mb_at_end: indexesAtEnd,
    notes: [
      args["tuned-autovacuum"]
        ? "the jobs table had gendurable's per-table autovacuum settings (no cost delay, 2 % scale factors)"
        : "the jobs table kept PostgreSQL's autovacuum defaults, as graphile-worker ships it " +
          "(gendurable's migration sets per-table ones on its own table)",
      "no history: graphile-worker deletes a job when it completes, so it keeps no finished rows and " +
        "prunes nothing; its table started empty (gendurable's soak starts on a table of finished rows " +
        "and prunes them as it goes)",
      `the 20 % on keys ran in 1,000 named queues (one job at a time per queue, graphile's K = 1); ` +
        `the 5 % "gate of 50" ran as plain jobs, as graphile-worker has no limit above one per queue ` +
        `(${completed.gate.toLocaleString("en")} of them completed, unlimited)`,
      `the 5 % that fail their first attempt were retried with graphile-worker's own backoff ` +
        `(due exp(1) = 2.7 s after the failure; gendurable's soak retries after 10-50 ms): ` +
        `${failedAttempts.toLocaleString("en")} first attempts failed, ` +
        `${completed.retry.toLocaleString("en")} retries completed`,
      "fetch p99: the worker's get_job batch query (up to 80 jobs), timed around its round trip; " +
        "start latency: a job's start minus its run_at (a retry's run_at is its backoff's end)",
      "backlog: jobs that could start now (not locked, due, at most one per unlocked named queue); " +
        `rows still waiting at the end, in named queues and retries included: ${(samples.at(-1)?.queued ?? 0).toLocaleString("en")}`,
    ],
    samples,
  }),
);
await utils.release();
await sampler.end();
process.exit(0); // the worker library may leave timers behind
