// The SQL floor for bench/peers/run: what PostgreSQL itself does with the queue's statements and
// no job system around them, on a table shaped like a job queue. One JSON line per figure:
//   node floor.mjs drain --jobs N --connections C   claim 1,000 due jobs (FOR UPDATE SKIP
//                                                   LOCKED), then complete them (delete into a
//                                                   history table), on C connections; jobs/s
import pg from "pg";

const url = process.env.DATABASE_URL;
if (!url) {
  console.error("floor.mjs: DATABASE_URL is not set");
  process.exit(2);
}
const [mode, ...rest] = process.argv.slice(2);
const args = {};
for (let i = 0; i + 1 < rest.length; i += 2) args[rest[i].replace(/^--/, "")] = Number(rest[i + 1]);

const claimSql = `
WITH c AS (SELECT id FROM baton_floor.jobs
            WHERE state = 'available' AND run_at <= now()
            ORDER BY run_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED)
UPDATE baton_floor.jobs j SET state = 'running', attempts = attempts + 1
  FROM c WHERE j.id = c.id RETURNING j.id`;
const completeSql = `
WITH d AS (DELETE FROM baton_floor.jobs WHERE id = ANY($1::bigint[]) RETURNING id, queue, type)
INSERT INTO baton_floor.history (id, queue, type, finished_at)
SELECT id, queue, type, now() FROM d`;

async function drain() {
  const jobs = args.jobs ?? 100000;
  const connections = args.connections ?? 1;
  const setup = new pg.Client({ connectionString: url });
  await setup.connect();
  await setup.query(`
    DROP SCHEMA IF EXISTS baton_floor CASCADE;
    CREATE SCHEMA baton_floor;
    CREATE TABLE baton_floor.jobs (
      id bigserial PRIMARY KEY, queue text NOT NULL, type text NOT NULL, payload jsonb NOT NULL,
      state text NOT NULL DEFAULT 'available', run_at timestamptz NOT NULL DEFAULT now(),
      attempts int NOT NULL DEFAULT 0);
    CREATE INDEX ON baton_floor.jobs (run_at, id) WHERE state = 'available';
    CREATE TABLE baton_floor.history (
      id bigint NOT NULL, queue text NOT NULL, type text NOT NULL, finished_at timestamptz NOT NULL);`);
  await setup.query(
    "INSERT INTO baton_floor.jobs (queue, type, payload) " +
      "SELECT 'default', 'noop', '{}' FROM generate_series(1, $1)",
    [jobs],
  );
  await setup.query("VACUUM ANALYZE baton_floor.jobs");
  const clients = [];
  for (let i = 0; i < connections; i++) {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    clients.push(c);
  }
  const started = process.hrtime.bigint();
  let done = 0;
  await Promise.all(
    clients.map(async (c) => {
      // Bounded: a claim that returns nothing ends the loop; at most jobs / 1 + 1 rounds.
      for (let round = 0; round <= jobs; round++) {
        const claimed = await c.query(claimSql);
        if (claimed.rowCount === 0) break;
        await c.query(completeSql, [claimed.rows.map((r) => r.id)]);
        done += claimed.rowCount;
      }
    }),
  );
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  for (const c of clients) await c.end();
  await setup.query("DROP SCHEMA baton_floor CASCADE");
  await setup.end();
  if (done !== jobs) throw new Error(`drained ${done} of ${jobs} jobs`);
  process.stdout.write(
    JSON.stringify({ peer: "sql", figure: "drain", jobs, connections, jobs_per_s: jobs / seconds }) +
      "\n",
  );
}

if (mode !== "drain") {
  console.error("floor.mjs: the only mode is drain");
  process.exit(2);
}
try {
  await drain();
} catch (e) {
  console.error(`floor.mjs: ${e.message}`);
  process.exit(1);
}
