// node-redlock 5 (on ioredis 5) for tools/compare: one long-lived process, connected once to
// the nodes given as arguments (redis:// URLs), that runs workloads it is sent on stdin, one JSON
// object a line, and answers each with one JSON line on stdout:
//
//   in:  {"op":"acquire"|"acquire_release"|"extend"|"contended","tasks":N,"max_ops":N,
//         "budget_ms":N,"prefix":"...","names":N|null}
//   out: {"elapsed_us":N,"workers":[{"ok":N,"busy":N,"err":N,"first_err":"..."|null,
//         "lat_us":[...],"handover_us":[...]}]}
//
// The same workloads as tools/compare/src/workload.rs: one attempt per operation (retryCount 0),
// a distinct key per operation or a bounded cycle of names, the one-key scenario pausing a random
// 0-2 ms after a refusal. The first line written is {"ready":true} once every node answered PING.
import Redis from "ioredis";
import Redlock, { ExecutionError } from "redlock";
import { createInterface } from "node:readline";

const TTL_MS = 10_000;
const urls = process.argv.slice(2);
const clients = urls.map((u) => new Redis(u, { lazyConnect: false }));
const redlock = new Redlock(clients, { retryCount: 0, retryDelay: 0, retryJitter: 0 });
// node-redlock emits every refused or failed node call as an "error" event; without a listener
// Node would throw them.
redlock.on("error", () => {});

const now = () => process.hrtime.bigint();
const us = (ns) => Number(ns / 1000n);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function failure(e) {
  return e instanceof ExecutionError ? "busy" : String(e && e.message ? e.message : e);
}

async function worker(spec, task, deadline, shared) {
  const out = { ok: 0, busy: 0, err: 0, first_err: null, lat_us: [], handover_us: [] };
  const record = (t0, result) => {
    if (result === true) {
      out.ok += 1;
      out.lat_us.push(us(now() - t0));
    } else if (result === "busy") {
      out.busy += 1;
    } else {
      out.err += 1;
      if (out.first_err === null) out.first_err = result;
    }
  };
  let held = null;
  if (spec.op === "extend") {
    try {
      held = await redlock.acquire([`${spec.prefix}:${task}:held`], TTL_MS);
    } catch (e) {
      record(now(), failure(e));
      return out;
    }
  }
  for (let i = 0; i < spec.max_ops && now() < deadline; i++) {
    let key;
    if (spec.op === "contended") key = spec.prefix;
    else if (spec.names) key = `${spec.prefix}:${task}:${i % spec.names}`;
    else key = `${spec.prefix}:${task}:${i}`;
    const t0 = now();
    let result;
    try {
      if (spec.op === "acquire") {
        await redlock.acquire([key], TTL_MS);
        result = true;
      } else if (spec.op === "acquire_release") {
        const lock = await redlock.acquire([key], TTL_MS);
        await lock.release();
        result = true;
      } else if (spec.op === "extend") {
        held = await held.extend(TTL_MS);
        result = true;
      } else {
        const lock = await redlock.acquire([key], TTL_MS);
        const t = now();
        if (shared.released !== null) out.handover_us.push(us(t - shared.released));
        shared.released = t;
        await lock.release();
        result = true;
      }
    } catch (e) {
      result = failure(e);
    }
    record(t0, result);
    if (spec.op === "contended" && result !== true) await sleep(Math.random() * 2);
  }
  if (held) {
    try {
      await held.release();
    } catch (_) {
      // best effort, as the Rust workers
    }
  }
  return out;
}

async function run(spec) {
  const start = now();
  const deadline = start + BigInt(spec.budget_ms) * 1_000_000n;
  const shared = { released: null };
  const workers = await Promise.all(
    Array.from({ length: spec.tasks }, (_, t) => worker(spec, t, deadline, shared)),
  );
  return { elapsed_us: us(now() - start), workers };
}

await Promise.all(clients.map((c) => c.ping()));
process.stdout.write(JSON.stringify({ ready: true }) + "\n");
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const result = await run(JSON.parse(line));
  process.stdout.write(JSON.stringify(result) + "\n");
}
for (const c of clients) c.disconnect();
