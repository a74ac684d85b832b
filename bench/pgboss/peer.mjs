// pg-boss as a peer of `queuectl bench --scenario sustained`: one producer, one consumer or the
// install, driven by queuectl.bench.sustained_peers over stdin / stdout in JSON lines.
//
// stdin:  the spec (one JSON line: command, connection (node-postgres's host, port, user, password,
//         database: a host that is a directory is a unix socket's), schema, queue, batch,
//         payload_bytes, seed, rate, phase), then "go" once every worker is ready, then "stop" at the end of the window.
// stdout: {"ready": ..., "warmup_count": n} once warmed up, then {"report": {...}} once stopped;
//         {"error": "..."} on a failure (and exit status 1).
//
// Times are seconds since the epoch from the same clock as Python's time.time(), so the send
// stamp a producer writes into a job's data and the time a consumer's handler sees it are
// comparable across processes.
//
// pg-boss runs with its defaults (its own schema, named by `schema`; retries, expiry, retention
// and supervision as they come) but for what the scenario needs: consumers call work() with
// batchSize = the scenario's --batch, and the queue is created with notify on and the instances
// with useListenNotify, pg-boss's own low-latency delivery (a NOTIFY at each insert wakes the
// workers), so consumers take jobs as they come, as the other peers' do, instead of every
// pollingIntervalSeconds (2 s by default).

import { randomBytes } from 'node:crypto'
import { createRequire } from 'node:module'
import { performance } from 'node:perf_hooks'
import readline from 'node:readline'

import { PgBoss } from 'pg-boss'

const WARMUP_CALLS = 6 // as queuectl.bench.workers.WARMUP_CALLS
const WARMUP_STAMP = 0 // warm-up jobs carry no send time: their latency is not counted
const CONSUMER_WARMUP_MS = 500 // a consumer takes the warm-up jobs before it says it is ready
const POOL = 64

const now = () => (performance.timeOrigin + performance.now()) / 1000
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))
// resolves once the line is handed to the pipe: a process.exit() before that would cut a long
// report at the pipe's buffer
const say = obj => new Promise(resolve => process.stdout.write(JSON.stringify(obj) + '\n', resolve))
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6 }
let cpuAtGo = null // the CPU seconds this process had used when the window began

function version () {
  const require = createRequire(import.meta.url)
  return require('pg-boss/package.json').version
}

// stdin, line by line: the spec first, then the commands ("go", "stop")
const lines = readline.createInterface({ input: process.stdin })
const waiting = []
const queued = []
lines.on('line', line => {
  const next = waiting.shift()
  if (next) next(line.trim())
  else queued.push(line.trim())
})
lines.on('close', () => { for (const next of waiting.splice(0)) next('stop') })
const nextLine = () => queued.length ? Promise.resolve(queued.shift()) : new Promise(resolve => waiting.push(resolve))

async function until (word) {
  for (;;) {
    const line = await nextLine()
    if (line === 'go') cpuAtGo = cpu()
    if (line === word || line === 'stop') return line
  }
}

function boss (spec, options = {}) {
  const b = new PgBoss({ ...spec.connection, schema: spec.schema, ...options })
  b.errors = []
  b.on('error', err => b.errors.push(String(err?.message ?? err)))
  return b
}

function checked (b) {
  if (b.errors.length) throw new Error(`pg-boss: ${b.errors[0]}`)
}

// pg-boss's schema and the bench's queue; the schema is created by start() (migrate, createSchema)
async function install (spec) {
  const b = boss(spec, { supervise: false, schedule: false })
  await b.start()
  await b.createQueue(spec.queue, { notify: true })
  await b.stop({ graceful: false })
  checked(b)
  return { version: version() }
}

function payloads (spec) {
  const size = Math.max(spec.payload_bytes - 8, 0) // the others' payloads carry the stamp in their first 8 bytes
  return Array.from({ length: POOL }, () => randomBytes(size).toString('base64'))
}

async function producer (spec) {
  const b = boss(spec)
  await b.start()
  const pool = payloads(spec)
  const n = spec.batch
  let pick = spec.seed % POOL
  const send = async stamp => {
    const jobs = []
    for (let i = 0; i < n; i++) jobs.push({ data: { sent: stamp, body: pool[pick++ % POOL] } })
    await b.insert(spec.queue, jobs)
    return n
  }
  let warm = 0
  for (let i = 0; i < WARMUP_CALLS; i++) warm += await send(WARMUP_STAMP)
  say({ ready: true, warmup_count: warm, version: version() })
  if (await until('go') === 'stop') return finish(b, { warmup_count: warm, batch: n, due: [], sent: [], accepted: [] })
  let stopped = false
  until('stop').then(() => { stopped = true })
  // the schedule of queuectl.bench.paced.Schedule: the k-th send is due at t0 + k periods
  const period = n / spec.rate
  const t0 = now() + spec.phase * period
  const due = []; const sent = []; const accepted = []
  for (let k = 0; !stopped; k++) {
    const at = t0 + k * period
    while (!stopped && now() < at) await sleep(Math.min(100, Math.max(1, (at - now()) * 1000)))
    if (stopped) break
    const t = now()
    const ok = await send(t)
    due.push(at); sent.push(t); accepted.push(ok)
  }
  return finish(b, { warmup_count: warm, batch: n, due, sent, accepted })
}

async function consumer (spec) {
  const b = boss(spec, { useListenNotify: true })
  await b.start()
  const done = []; const latency = []
  let counting = false
  let warm = 0
  let retried = 0
  await b.work(spec.queue, { batchSize: spec.batch }, async jobs => { // a no-op handler: returning completes the batch
    const t = now()
    for (const job of jobs) {
      if (job.retryCount > 0) retried++ // a job run a second time
      if (!counting) { warm++; continue }
      const stamp = job.data.sent
      done.push(t)
      latency.push(stamp !== WARMUP_STAMP ? t - stamp : null)
    }
  })
  await sleep(CONSUMER_WARMUP_MS) // takes the warm-up jobs (in the ledger, not in the series)
  say({ ready: true, warmup_count: warm, version: version() })
  if (await until('go') !== 'stop') {
    counting = true
    await until('stop')
  }
  await b.offWork(spec.queue, { wait: true }) // the batch in hand is completed before the report
  return finish(b, { warmup_count: warm, done, latency, retried })
}

async function finish (b, report) {
  await b.stop({ graceful: true })
  checked(b)
  return { ...report, cpu_seconds: cpuAtGo === null ? 0 : cpu() - cpuAtGo }
}

async function main () {
  const spec = JSON.parse(await nextLine())
  const run = { install, producer, consumer }[spec.command]
  if (!run) throw new Error(`unknown command ${spec.command}`)
  await say({ report: await run(spec) })
}

main().then(() => {
  lines.close()
  process.exit(0)
}, async err => {
  await say({ error: `${err?.name ?? 'Error'}: ${err?.message ?? err}` })
  process.exit(1)
})
