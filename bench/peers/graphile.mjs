// Measures Graphile Worker on a PostgreSQL server, for bench/peers/run (which runs it with the
// Node 22 from ./node_modules). One figure per call, printed as one JSON line:
//   node graphile.mjs drain   --jobs N --processes P   no-op jobs queued first, then P worker
//                                                      processes drain them; jobs/s
//   node graphile.mjs enqueue --jobs N --batch B       addJobs() in batches of B; jobs/s
//   node graphile.mjs serve                            a tuned worker for no-op jobs, until
//                                                      killed (for the producers' figure)
//   node graphile.mjs latency --samples S              one job at a time on an idle worker:
//                                                      addJob() return to handler start; ms
// As in baton's drain, start-up is not timed: the jobs are queued to run in an hour, the workers
// start and connect, and the clock starts when one transaction makes every job due.
// Workers are tuned as in Graphile Worker's own perfTest: 24 concurrent jobs, a pool of 25, a
// local queue of 500, outcomes completed in batches.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { makeWorkerUtils, run, runMigrations } from "graphile-worker";
import pg from "pg";

// As in Graphile Worker's perfTest: no log line per successful job.
process.env.NO_LOG_SUCCESS = "1";
const url = process.env.DATABASE_URL;
if (!url) {
  console.error("graphile.mjs: DATABASE_URL is not set");
  process.exit(2);
}
const [mode, ...rest] = process.argv.slice(2);
const args = {};
for (let i = 0; i + 1 < rest.length; i += 2) args[rest[i].replace(/^--/, "")] = Number(rest[i + 1]);

const tuned = {
  connectionString: url,
  concurrency: 24,
  maxPoolSize: 25,
  noHandleSignals: true,
  pollInterval: 2000,
  preset: {
    worker: {
      concurrentJobs: 24,
      maxPoolSize: 25,
      localQueue: { size: 500, refetchDelay: { durationMs: 10 } },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    },
  },
};

async function resetSchema() {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query("DROP SCHEMA IF EXISTS graphile_worker CASCADE");
  await client.end();
  await runMigrations({ connectionString: url });
}

async function queued(client) {
  const r = await client.query(
    "SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE task_id = " +
      "(SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'noop')",
  );
  return r.rows[0].n;
}

async function fill(jobs, due) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  // Straight into the table through Graphile Worker's own add_jobs, 10,000 a call.
  for (let done = 0; done < jobs; done += 10000) {
    const n = Math.min(10000, jobs - done);
    await client.query(
      "SELECT graphile_worker.add_jobs(array(SELECT json_populate_record(null::graphile_worker.job_spec, " +
        "json_build_object('identifier', 'noop', 'payload', '{}'::json, 'run_at', $2::timestamptz)) " +
        "FROM generate_series(1, $1)))",
      [n, due],
    );
  }
  await client.end();
}

async function worker() {
  // A drain worker: runs until the parent says stop (a line on stdin) or its stdin closes.
  const runner = await run({ ...tuned, taskList: { noop: async () => {} } });
  process.send("ready");
  await new Promise((resolve) => {
    process.stdin.on("data", resolve);
    process.stdin.on("end", resolve);
  });
  await runner.stop();
}

async function serve() {
  await resetSchema();
  await run({ ...tuned, taskList: { noop: async () => {} } });
  await new Promise(() => {});
}

async function drain() {
  const jobs = args.jobs ?? 100000;
  const processes = args.processes ?? 1;
  await resetSchema();
  await fill(jobs, new Date(Date.now() + 3600000).toISOString());
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query("VACUUM ANALYZE graphile_worker._private_jobs");
  const self = fileURLToPath(import.meta.url);
  const children = [];
  const ready = [];
  for (let i = 0; i < processes; i++) {
    const child = spawn(process.execPath, [self, "worker"], {
      stdio: ["pipe", "ignore", "inherit", "ipc"],
    });
    ready.push(new Promise((r) => child.once("message", r)));
    children.push(child);
  }
  await Promise.all(ready);
  await client.query("BEGIN");
  await client.query("UPDATE graphile_worker._private_jobs SET run_at = now()");
  await client.query("SELECT pg_notify('jobs:insert', $1)", [JSON.stringify({ count: jobs })]);
  const started = process.hrtime.bigint();
  await client.query("COMMIT");
  // Bounded: 10 minutes at most.
  const deadline = Date.now() + 600000;
  while ((await queued(client)) > 0) {
    if (Date.now() > deadline) throw new Error("drain did not finish in 10 minutes");
    await new Promise((r) => setTimeout(r, 5));
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  for (const c of children) c.stdin.end("stop\n");
  await Promise.all(children.map((c) => new Promise((r) => c.on("exit", r))));
  await client.end();
  print({ peer: "graphile-worker", figure: "drain", jobs, processes, jobs_per_s: jobs / seconds });
}

async function enqueue() {
  const jobs = args.jobs ?? 100000;
  const batch = args.batch ?? 1000;
  await resetSchema();
  const utils = await makeWorkerUtils({ connectionString: url });
  const specs = Array.from({ length: batch }, (_, i) => ({ identifier: "noop", payload: { i } }));
  const started = process.hrtime.bigint();
  for (let done = 0; done < jobs; done += batch) await utils.addJobs(specs);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await utils.release();
  print({ peer: "graphile-worker", figure: "enqueue", batch, jobs, jobs_per_s: jobs / seconds });
}

async function latency() {
  const samples = args.samples ?? 1000;
  await resetSchema();
  let started = null;
  let wake = null;
  const runner = await run({
    ...tuned,
    taskList: {
      noop: async () => {
        started = process.hrtime.bigint();
        wake?.();
      },
    },
  });
  const utils = await makeWorkerUtils({ connectionString: url });
  const ms = [];
  for (let i = 0; i < samples + 20; i++) {
    started = null;
    const done = new Promise((r) => (wake = r));
    await utils.addJob("noop", {});
    const returned = process.hrtime.bigint();
    await Promise.race([done, new Promise((_, no) => setTimeout(() => no(new Error("no start in 10 s")), 10000))]);
    // The first 20 warm the worker up; the rest are the figure.
    if (i >= 20) ms.push(Math.max(0, Number(started - returned) / 1e6));
    await new Promise((r) => setTimeout(r, 2));
  }
  await utils.release();
  await runner.stop();
  ms.sort((a, b) => a - b);
  const at = (q) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))];
  print({ peer: "graphile-worker", figure: "latency", samples, p50_ms: at(0.5), p99_ms: at(0.99) });
}

function print(figure) {
  process.stdout.write(JSON.stringify(figure) + "\n");
}

const modes = { worker, serve, drain, enqueue, latency };
if (!modes[mode]) {
  console.error("graphile.mjs: mode is one of drain, enqueue, latency, serve");
  process.exit(2);
}
try {
  await modes[mode]();
} catch (e) {
  console.error(`graphile.mjs ${mode}: ${e.message}`);
  process.exit(1);
}
