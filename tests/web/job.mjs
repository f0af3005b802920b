// The page's job view: four ranks of one job recorded by job_worker (rank 2 keeping more
// from iteration 4), `memtrace view` of their logs. /jobs must be the report's "jobs" for
// the same logs (`memtrace report --json --by function`), and the page (headless Chromium,
// when it can be had) must name rank 2 as the highest, its tag and call site, show the ranks
// side by side per iteration, and open rank 2's process on a click.
//
//   node job.mjs MEMTRACE JOB_WORKER
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';
import { launchChromium } from './chromium.mjs';

const [memtrace, worker] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'mt-job-'));
const children = [];
let browser = null;
const RANKS = 4, BIG = 2, ITERS = 10, FROM = 4;

async function fail(msg) {
  console.error('FAIL: ' + msg);
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  if (browser) await browser.close().catch(() => {});
  rmSync(tmp, { recursive: true, force: true });
  process.exit(1);
}

function view(args) {
  return new Promise((resolve, reject) => {
    const p = spawn(memtrace, ['view', '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(p);
    let err = '';
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve({ proc: p, url: m[0] });
    });
    p.on('exit', (code) => reject(new Error(`memtrace view exited (${code}): ${err}`)));
    setTimeout(() => reject(new Error('memtrace view did not say where it listens: ' + err)), 30000);
  });
}
const tokenOf = (base) => new URLSearchParams(new URL(base).hash.slice(1)).get('token');
async function get(base, path) {
  const tok = tokenOf(base);
  const r = await fetch(new URL(path, base), { headers: tok ? { Authorization: 'Bearer ' + tok } : {} });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

try {
  const logs = [];
  for (let r = 0; r < RANKS; r++) {
    const log = join(tmp, `rank${r}.ndjson`);
    logs.push(log);
    execFileSync(worker, [String(ITERS), ...(r === BIG ? [String(FROM)] : [])], {
      env: { ...process.env, RANK: String(r), WORLD_SIZE: String(RANKS), MEMTRACE_JOB: 'ddp-4',
        MEMTRACE_LOG: log, MEMTRACE_STACKS: 'all', MEMTRACE_OOM_DIR: 'off' } });
  }
  const want = JSON.parse(execFileSync(memtrace, ['report', '--json', '--by', 'function', ...logs],
    { encoding: 'utf8' })).jobs;
  const v = await view(logs);
  const jobs = await get(v.url, '/jobs');
  if (!isDeepStrictEqual(jobs, want))
    await fail(`/jobs ${JSON.stringify(jobs)} != report ${JSON.stringify(want)}`);
  const h = jobs[0].highest;
  if (h.rank !== BIG || !h.above_median_by_site[0].site.startsWith('grow_cache'))
    await fail('highest: ' + JSON.stringify(h));
  console.log(`ok: /jobs is the report's jobs: rank ${h.rank} highest, ${h.above_median_by_site[0].site}`);

  browser = await launchChromium(here);
  if (browser) {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(v.url);
    await page.waitForSelector('#jobs:not([hidden]) .job-ranks tbody tr', { timeout: 30000 });
    const title = await page.textContent('#jobs h3');
    if (!title.includes('job ddp-4: 4 ranks of 4') || !title.includes('aligned by iteration marks'))
      await fail('job title: ' + title);
    const highest = await page.$$eval('#jobs .job-ranks tr.highest td', (t) => t.map((c) => c.textContent));
    if (highest[0] !== String(BIG)) await fail('highlighted row: ' + JSON.stringify(highest));
    const tag = await page.textContent('#jobs [data-diff="tag"]');
    const site = await page.textContent('#jobs [data-diff="site"]');
    if (!tag.includes('kv_cache +48.0 MiB') || !site.includes('grow_cache') || !site.includes('+48.0 MiB'))
      await fail(`differences: ${tag} / ${site}`);
    const iters = await page.$$eval('#jobs .job-iterations tbody tr', (rows) =>
      rows.map((r) => [...r.cells].map((c) => c.dataset.bytes || c.textContent)));
    const last = iters[iters.length - 1];
    if (iters.length !== 8 || last[0] !== String(ITERS - 1) ||
        Number(last[1 + BIG]) - Number(last[1]) !== (ITERS - FROM) * 8 * 1048576)
      await fail('iterations table: ' + JSON.stringify(iters));
    await page.click(`#jobs .job-ranks tbody tr:nth-child(${BIG + 1})`);
    await page.waitForFunction((pid) => window.mtPage.pid === pid, jobs[0].ranks[BIG].pid, { timeout: 30000 });
    if (errors.length) await fail('page errors: ' + errors.join('; '));
    console.log(`ok: the page names rank ${BIG} (${site.trim()}), aligns ${iters.length} iterations, and opens its process`);
  }
  await browser?.close();
  browser = null;
  v.proc.kill('SIGINT');
} catch (e) {
  await fail(e.stack || String(e));
}
rmSync(tmp, { recursive: true, force: true });
