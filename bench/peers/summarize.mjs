// Summarizes bench/peers/run's measurements: node summarize.mjs LINES COMMIT ROUNDS.
// Writes the JSON document (every measurement, medians, ranges, ratios) to stdout and a table to
// stderr. A ratio is taken within each round (both systems measured minutes apart on the same
// server), then its median over the rounds is reported.
import { readFileSync } from "node:fs";
import os from "node:os";

const [file, commit, rounds] = process.argv.slice(2);
const rows = readFileSync(file, "utf8")
  .split("\n")
  .filter((l) => l.startsWith("{"))
  .map((l) => JSON.parse(l));

const series = {
  "baton drain, node defaults": (r) => r.peer === "baton" && r.figure === "drain" && r.settings === "defaults" && r.jobs_per_s,
  "baton drain, 16 threads, batch 1000": (r) => r.peer === "baton" && r.figure === "drain" && r.settings === "tuned" && r.jobs_per_s,
  "graphile-worker drain, 1 process": (r) => r.peer === "graphile-worker" && r.figure === "drain" && r.processes === 1 && r.jobs_per_s,
  "graphile-worker drain, 2 processes": (r) => r.peer === "graphile-worker" && r.figure === "drain" && r.processes === 2 && r.jobs_per_s,
  "sql floor drain, 1 connection": (r) => r.peer === "sql" && r.figure === "drain" && r.connections === 1 && r.jobs_per_s,
  "sql floor drain, 2 connections": (r) => r.peer === "sql" && r.figure === "drain" && r.connections === 2 && r.jobs_per_s,
  "baton enqueue, batches of 1000": (r) => r.peer === "baton" && r.figure === "enqueue" && r.batch === 1000 && r.jobs_per_s,
  "graphile-worker enqueue, batches of 1000": (r) => r.peer === "graphile-worker" && r.figure === "enqueue" && r.batch === 1000 && r.jobs_per_s,
  "sql floor COPY, 1000 rows a statement": (r) => r.peer === "sql" && r.figure === "copy" && r.jobs_per_s,
  "baton latency p50 ms": (r) => r.peer === "baton" && r.figure === "latency" && r.p50_ms,
  "baton latency p99 ms": (r) => r.peer === "baton" && r.figure === "latency" && r.p99_ms,
  "sql floor latency p50 ms (NOTIFY, one claim)": (r) => r.peer === "sql" && r.figure === "latency" && r.p50_ms,
  "sql floor latency p99 ms (NOTIFY, one claim)": (r) => r.peer === "sql" && r.figure === "latency" && r.p99_ms,
  "graphile-worker latency p50 ms": (r) => r.peer === "graphile-worker" && r.figure === "latency" && r.p50_ms,
  "graphile-worker latency p99 ms": (r) => r.peer === "graphile-worker" && r.figure === "latency" && r.p99_ms,
  "baton producers, one job a transaction": (r) => r.peer === "baton" && r.figure === "producers" && r.jobs_per_s,
  "plain INSERT producers, one job a transaction": (r) => r.peer === "sql" && r.figure === "producers" && r.jobs_per_s,
  "graphile-worker producers, one job a transaction": (r) => r.peer === "graphile-worker" && r.figure === "producers" && r.jobs_per_s,
  "INSERT in a SECURITY DEFINER function, producers": (r) => r.peer === "sql-definer" && r.figure === "producers" && r.jobs_per_s,
};
const ratios = {
  "baton defaults / graphile-worker 1 process (drain)": ["baton drain, node defaults", "graphile-worker drain, 1 process"],
  "baton defaults / graphile-worker 2 processes (drain)": ["baton drain, node defaults", "graphile-worker drain, 2 processes"],
  "baton 16 threads / graphile-worker 2 processes (drain)": ["baton drain, 16 threads, batch 1000", "graphile-worker drain, 2 processes"],
  "baton defaults / sql floor 2 connections (drain)": ["baton drain, node defaults", "sql floor drain, 2 connections"],
  "baton / graphile-worker (enqueue, batches of 1000)": ["baton enqueue, batches of 1000", "graphile-worker enqueue, batches of 1000"],
  "baton / COPY (enqueue, batches of 1000)": ["baton enqueue, batches of 1000", "sql floor COPY, 1000 rows a statement"],
  "graphile-worker / baton (latency p50; above 1: baton starts sooner)": ["graphile-worker latency p50 ms", "baton latency p50 ms"],
  "graphile-worker / baton (latency p99)": ["graphile-worker latency p99 ms", "baton latency p99 ms"],
  "baton / sql floor (latency p50; 1: at the floor)": ["baton latency p50 ms", "sql floor latency p50 ms (NOTIFY, one claim)"],
  "baton / plain INSERT (producers)": ["baton producers, one job a transaction", "plain INSERT producers, one job a transaction"],
  "baton / graphile-worker (producers)": ["baton producers, one job a transaction", "graphile-worker producers, one job a transaction"],
  "SECURITY DEFINER INSERT / plain INSERT (producers)": ["INSERT in a SECURITY DEFINER function, producers", "plain INSERT producers, one job a transaction"],
  "baton / SECURITY DEFINER INSERT (producers)": ["baton producers, one job a transaction", "INSERT in a SECURITY DEFINER function, producers"],
};

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length === 0 ? null : s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const byRound = (name) => {
  const out = new Map();
  for (const r of rows) {
    const v = series[name](r);
    if (typeof v === "number") out.set(r.round, v);
  }
  return out;
};

const figures = {};
for (const name of Object.keys(series)) {
  const values = [...byRound(name).values()];
  figures[name] = { median: median(values), min: Math.min(...values), max: Math.max(...values), rounds: values };
}
const ratioFigures = {};
for (const [name, [a, b]] of Object.entries(ratios)) {
  const ra = byRound(a);
  const rb = byRound(b);
  const values = [...ra.keys()].filter((k) => rb.has(k) && rb.get(k) > 0).map((k) => ra.get(k) / rb.get(k));
  ratioFigures[name] = { median: median(values), rounds: values };
}

const fmt = (v) => (v === null || !Number.isFinite(v) ? "-" : v >= 100 ? v.toFixed(0) : v.toFixed(2));
const table = [];
for (const [name, f] of Object.entries(figures)) {
  table.push(`${name.padEnd(52)} ${fmt(f.median).padStart(9)}  (${fmt(f.min)} .. ${fmt(f.max)})`);
}
table.push("");
for (const [name, f] of Object.entries(ratioFigures)) {
  table.push(`${name.padEnd(70)} ${fmt(f.median).padStart(6)}  rounds ${f.rounds.map(fmt).join(" ")}`);
}
process.stderr.write(table.join("\n") + "\n");

process.stdout.write(
  JSON.stringify(
    {
      date: new Date().toISOString(),
      commit,
      rounds: Number(rounds),
      machine: { cores: os.cpus().length, cpu: os.cpus()[0]?.model, memory_kb: Math.round(os.totalmem() / 1024) },
      figures,
      ratios: ratioFigures,
      measurements: rows,
    },
    null,
    1,
  ) + "\n",
);
