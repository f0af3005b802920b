// The page's analysis panels and its compare view, on recorded runs:
// - a log with known scopes, temporary allocations and settings changes
//   (make_analysis_log.py): /analysis gives what `memtrace report --json` gives, and the page
//   (headless Chromium, when it can be had) shows those numbers and marks both settings
//   changes on the chart;
// - two runs (tests/diff/make_run.py, with the same pid): `memtrace view BEFORE AFTER`
//   lists two processes, /diff is `memtrace diff --json`'s document, and the page's compare
//   view shows its figures and changed sites.
//
//   node analysis.mjs MEMTRACE SOURCE_ROOT PYTHON
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';
import { launchChromium } from './chromium.mjs';

const [memtrace, srcRoot, python] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'mt-analysis-'));
const children = [];
let browser = null;

async function fail(msg) {
  console.error('FAIL: ' + msg);
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  if (browser) await browser.close().catch(() => {});
  rmSync(tmp, { recursive: true, force: true });
  process.exit(1);
}

// `memtrace view ARGS...`; resolves with {proc, url} once it says where it listens.
function view(args) {
  return new Promise((resolve, reject) => {
    const p = spawn(memtrace, ['view', '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(p);
    let err = '';
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve({ proc: p, url: m[0], err: () => err });
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
const exited = (p) => new Promise((r) => (p.exitCode !== null ? r(p.exitCode) : p.on('exit', r)));
const cli = (args) => JSON.parse(execFileSync(memtrace, args, { encoding: 'utf8' }));
const MiB = 1 << 20;

// The rows of a table's body as arrays of {text, data} per cell.
const tableRows = (page, id) => page.$$eval(`#${id} tbody tr`, (rows) => rows.map((r) =>
  [...r.cells].map((c) => ({ text: c.textContent, data: { ...c.dataset } }))));

try {
  browser = await launchChromium(here);

  /* ---- scopes, temporary allocations, settings changes ---- */
  const log = join(tmp, 'analysis.ndjson');
  execFileSync(python, [join(here, 'make_analysis_log.py'), log, '4343']);
  const rep = cli(['report', '--json', log]).processes[0];
  const v = await view([log]);
  const a = await get(v.url, '/analysis?pid=4343');
  for (const k of ['scopes', 'temporary', 'temporary_by']) {
    if (!isDeepStrictEqual(a[k], rep[k]))
      await fail(`/analysis ${k} ${JSON.stringify(a[k])} != report ${JSON.stringify(rep[k])}`);
  }
  const strip = (l) => l.map(({ at, ...rest }) => rest);
  if (!isDeepStrictEqual(strip(a.settings_changes), rep.settings_changes))
    await fail(`/analysis settings ${JSON.stringify(a.settings_changes)} != report ${JSON.stringify(rep.settings_changes)}`);
  // The figures the log was written to have (make_analysis_log.py).
  const fwd = a.scopes.find((s) => s.name === 'forward');
  if (!fwd || fwd.count !== 2 || fwd.peak_bytes !== 6 * MiB || fwd.mean_peak_bytes !== 4 * MiB)
    await fail('scope forward: ' + JSON.stringify(fwd));
  const t0 = a.temporary[0], t1 = a.temporary[1];
  if (a.temporary.length !== 2 || t0.site !== 'forward (model.py:12)' || t0.count !== 3 ||
      t0.bytes !== 3 * MiB || t0.median_lifetime_us !== 7 || t1.site !== 'loss (model.py:30)' ||
      t1.count !== 2 || t1.median_lifetime_us !== 20)
    await fail('temporary: ' + JSON.stringify(a.temporary));
  if (a.settings_changes.map((s) => s.key).join() !== 'max_split_size_mb,garbage_collection_threshold' ||
      Math.abs(a.settings_changes[1].at - a.settings_changes[0].at - 0.04) > 1e-6)
    await fail('settings: ' + JSON.stringify(a.settings_changes));
  console.log('ok: /analysis gives the report\'s scopes, temporary sites and settings changes');

  if (browser) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await page.goto(v.url);
    await page.waitForFunction(() => window.mtPage && window.mtPage.analysis &&
      !window.mtPage.analysis.pending && document.querySelectorAll('#temporary tbody td[data-n]').length > 0,
    null, { timeout: 30000 });
    const scopes = await tableRows(page, 'scopes');
    const want = rep.scopes.map((s) => [s.name, String(s.count), String(s.peak_bytes), String(s.mean_peak_bytes)]);
    const got = scopes.map((r) => [r[0].text, r[1].data.n, r[2].data.bytes, r[3].data.bytes]);
    if (!isDeepStrictEqual(got, want)) await fail(`scopes panel ${JSON.stringify(got)} != ${JSON.stringify(want)}`);
    if (scopes[0][2].text !== '6.00 MiB') await fail('forward\'s peak reads ' + scopes[0][2].text);
    const temps = await tableRows(page, 'temporary');
    const wantT = rep.temporary.map((s) => [s.site, String(s.count), String(s.bytes), String(s.median_lifetime_us)]);
    const gotT = temps.map((r) => [r[0].text, r[1].data.n, r[2].data.bytes, r[3].data.us]);
    if (!isDeepStrictEqual(gotT, wantT)) await fail(`temporary panel ${JSON.stringify(gotT)} != ${JSON.stringify(wantT)}`);
    if (temps[0][3].text !== '7 µs') await fail('median lifetime reads ' + temps[0][3].text);
    const sets = await tableRows(page, 'settings');
    const gotS = sets.map((r) => [r[3].text, r[4].text, r[5].text]);
    const wantS = [['max_split_size_mb', '128 MiB', '64 MiB'], ['garbage_collection_threshold', '0', '0.8']];
    if (!isDeepStrictEqual(gotS, wantS)) await fail(`settings panel ${JSON.stringify(gotS)} != ${JSON.stringify(wantS)}`);
    // Both changes are inside the chart's range: a mark each.
    await page.waitForFunction(() => window.mtPage.settingMarks === 2, null, { timeout: 30000 })
      .catch(async () => fail('the chart marks ' + await page.evaluate(() => window.mtPage.settingMarks) + ' settings changes, not 2'));
    if (!(await page.isHidden('#runs'))) await fail('one input, yet the compare view shows');
    await page.close();
    console.log('ok: the page shows the scopes, temporary sites and settings changes, two marks on the chart');
  }
  v.proc.kill('SIGINT');
  if ((await exited(v.proc)) !== 0) await fail('memtrace view of one log did not exit 0');
  // One input: no comparison.
  const v1 = await view([log]);
  const r404 = await fetch(new URL('/diff', v1.url), { headers: { Authorization: 'Bearer ' + tokenOf(v1.url) } });
  if (r404.status !== 404) await fail('/diff of one input answers ' + r404.status);
  v1.proc.kill('SIGINT');
  await exited(v1.proc);

  /* ---- two runs compared ---- */
  const before = join(tmp, 'before.ndjson'), after = join(tmp, 'after.ndjson');
  const mk = join(srcRoot, 'tests', 'diff', 'make_run.py');
  execFileSync(python, [mk, before, '--batch', '8']);
  execFileSync(python, [mk, after, '--batch', '16', '--cache']);
  const diff = cli(['diff', '--json', before, after]);
  const rb = cli(['report', '--json', before]).processes[0];
  const ra = cli(['report', '--json', after]).processes[0];
  const c = await view(['--compare', before, after]);
  const d = await get(c.url, '/diff');
  if (!isDeepStrictEqual(d.diff, diff)) await fail('/diff is not `memtrace diff --json`\'s document');
  if (d.before !== before || d.after !== after) await fail(`/diff names ${d.before}, ${d.after}`);
  // The same pid in both logs: two processes still, each with its run's figures.
  const procs = (await get(c.url, '/state')).processes;
  if (procs.length !== 2 || procs[0].peak_allocated_bytes !== rb.peak_allocated ||
      procs[1].peak_allocated_bytes !== ra.peak_allocated)
    await fail('two runs are not two processes: ' + JSON.stringify(procs.map((p) => [p.pid, p.peak_allocated_bytes])));
  console.log(`ok: /diff is memtrace diff's document; two processes (pids ${procs.map((p) => p.pid).join(', ')})`);

  if (browser) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await page.goto(c.url);
    await page.waitForSelector('#runs:not([hidden]) #runs-figures tbody tr', { timeout: 30000 });
    const figs = await tableRows(page, 'runs-figures');
    for (const r of figs) {
      const k = r[0].data.key, f = diff[k];
      if (!f || Number(r[1].data.bytes) !== f.before || Number(r[2].data.bytes) !== f.after ||
          Number(r[3].data.bytes) !== f.delta)
        await fail(`compare view ${k}: ${JSON.stringify(r)} != ${JSON.stringify(f)}`);
    }
    if (figs.length !== 4 || figs[0][0].data.key !== 'peak_allocated') await fail('compare figures: ' + JSON.stringify(figs));
    if (figs[0][4].text !== '+48.0 %') await fail('peak growth reads ' + figs[0][4].text);
    const sites = await tableRows(page, 'runs-sites');
    const wantSites = diff.sites.filter((s) => s.status !== 'same').map((s) => [s.status, s.key, String(s.before), String(s.after)]);
    const gotSites = sites.map((r) => [r[0].text, r[1].text, r[2].data.bytes, r[3].data.bytes]);
    if (!isDeepStrictEqual(gotSites, wantSites)) await fail(`compare sites ${JSON.stringify(gotSites)} != ${JSON.stringify(wantSites)}`);
    if (!gotSites.some((s) => s[0] === 'new' && /remember \(cache\.py:9\)/.test(s[1]))) await fail('the new cache site is not shown');
    const newList = await page.textContent('#runs-lists [data-list="new"]').catch(() => null);
    if (!newList || !newList.includes(diff.new[0])) await fail('the list of new sites reads ' + newList);
    await page.close();
    console.log(`ok: the compare view shows peak ${figs[0][1].text} -> ${figs[0][2].text} and ${sites.length} changed sites as memtrace diff`);
  }
  c.proc.kill('SIGINT');
  if ((await exited(c.proc)) !== 0) await fail('memtrace view BEFORE AFTER did not exit 0');

  /* ---- snapshots: temporary sites by their frames, and two of them compared ---- */
  const data = join(srcRoot, 'tests', 'snapshot', 'data');
  const sa = join(data, 'v2_all_actions_p4.pickle'), sb = join(data, 'v2_torch_frames.pickle');
  const srep = cli(['report', '--json', sa]).processes[0];
  const s = await view(['--compare', sa, sb]);
  const sana = await get(s.url, '/analysis?pid=1');
  if (!isDeepStrictEqual(sana.temporary, srep.temporary) || sana.temporary_by !== srep.temporary_by)
    await fail(`snapshot /analysis temporary ${JSON.stringify(sana.temporary)} != report ${JSON.stringify(srep.temporary)}`);
  if (!sana.temporary.length) await fail('the snapshot has no temporary site: nothing was compared');
  const sdiff = cli(['diff', '--json', sa, sb]);
  if (!isDeepStrictEqual((await get(s.url, '/diff')).diff, sdiff))
    await fail('/diff of two snapshots is not `memtrace diff --json`\'s document');
  s.proc.kill('SIGINT');
  if ((await exited(s.proc)) !== 0) await fail('memtrace view of two snapshots did not exit 0');
  console.log(`ok: a snapshot's temporary sites (${sana.temporary.map((x) => x.site).join(', ')}) and two snapshots' /diff as the CLI`);

  if (browser) await browser.close();
  rmSync(tmp, { recursive: true, force: true });
  process.exit(0);
} catch (e) {
  await fail(e.stack || String(e));
}
