// The web page in a real browser: memtraced and an instrumented program, the page loaded
// in headless Chromium (DevTools protocol, through playwright-core), and these checks:
// the process appears; the allocated figure shown equals /state within one refresh; the
// segment map's block count matches /state; selecting a tag filters the event tail; a past
// state (scrubbed) at the last event equals the live one; the rest of what the page shows
// (sparkline, chart series by tag, utilization and fragmentation, pinned host memory apart,
// the OOM alert, a clicked block's details, the comparison of two ranges); the page
// reconnects after the daemon restarts. Saves web-page.png in the build directory.
//
//   node page.mjs MEMTRACED WEB_PRODUCER BUILD_DIR
// Exit 0 = pass, 1 = fail (the failed check is named), 77 = skipped (the reason is said).
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve as absolute } from 'node:path';
import { fileURLToPath } from 'node:url';
import { said } from './said.mjs';

const [memtraced, producer, buildDir] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

function skip(why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
if (!existsSync(chromiumPath)) skip(`no chromium at ${chromiumPath} (./dev.sh test installs it)`);
let chromium;
try {
  chromium = createRequire(join(here, 'package.json'))('playwright-core').chromium;
} catch (e) {
  skip('playwright-core is not installed: npm ci --prefix tests/web');
}

const children = [];
const tmp = mkdtempSync(join(tmpdir(), 'mt-web-'));
let browser = null;

function fail(msg) {
  console.error('FAIL: ' + msg);
  cleanup();
  process.exit(1);
}
function cleanup() {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts memtraced in the foreground; resolves with its base URL (token included if the
// daemon prints one) once it listens.
function startDaemon(port) {
  return new Promise((resolve, reject) => {
    const d = spawn(memtraced, ['--foreground', '--socket', join(tmp, 'sock'), '--port', String(port)],
      { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(d);
    let err = '';
    d.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve({ proc: d, url: withToken(m[0], join(tmp, 'sock')) });
    });
    d.on('exit', (code) => reject(new Error(`memtraced exited (${code}): ${err}`)));
    setTimeout(() => reject(new Error('memtraced did not say where it listens: ' + err)), 10000);
  });
}

// The page's address with the daemon's token (SOCKET.token, where the daemon requires one)
// in the fragment, as `memtrace view` prints it: the page reads it there.
function withToken(url, sock) {
  const u = new URL(url);
  if (!new URLSearchParams(u.hash.slice(1)).get('token') && existsSync(sock + '.token'))
    u.hash = 'token=' + readFileSync(sock + '.token', 'utf8').trim();
  return u.toString();
}

async function getJSON(base, path) {
  const tok = new URLSearchParams(new URL(base).hash.slice(1)).get('token');
  const r = await fetch(new URL(path, base), { headers: tok ? { Authorization: 'Bearer ' + tok } : {} });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function waitFor(what, fn, ms = 10000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e.message;
    }
    await sleep(100);
  }
  fail(`${what} (last: ${JSON.stringify(last)})`);
}

try {
  let daemon = await startDaemon(0);
  const base = daemon.url;
  const port = Number(new URL(base).port);
  // In tmp: while the daemon is down below, the producer takes over into a local log in
  // its working directory, which must not be the build tree.
  const prod = spawn(absolute(producer), [join(tmp, 'sock'), '3', '3000', '60', '1'], { cwd: tmp, stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(prod);
  const holding = said(prod, 'holding', 60000);
  let prodOut = '';
  prod.stdout.on('data', (b) => { prodOut += b.toString(); });

  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1600 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(base, { waitUntil: 'load' });

  // 1. The process appears.
  const pid = prod.pid;
  await page.waitForSelector(`#procs tr[data-pid="${pid}"]`, { timeout: 10000 });
  console.log(`ok: process ${pid} listed`);

  // Let the churn end and the daemon read all of it: from then on the figures hold still.
  await holding;
  const updates = () => page.evaluate(() => window.mtPage.updates);
  // An update that was in flight when counting began may carry figures fetched before the
  // moment the test compares against: two updates ensure one fetched wholly after it.
  const waitUpdates = async (n) => {
    const u0 = await updates();
    await waitFor(`${n} page updates`, async () => (await updates()) >= u0 + n, 5000);
  };

  // 2. The allocated figure shown equals /state within one refresh.
  const st = await getJSON(base, '/state');
  const p = st.processes.filter((x) => x.pid === pid).pop();
  if (!p) fail('the producer is not in /state');
  await waitUpdates(2);
  const shown = Number(await page.getAttribute('#alloc-value', 'data-bytes'));
  if (shown !== p.allocated_bytes) fail(`page shows allocated ${shown}, /state says ${p.allocated_bytes}`);
  if (!(shown > 0)) fail('allocated is 0: the producer recorded nothing');
  console.log(`ok: allocated ${shown} = /state`);

  // 3. The segment map's block count matches /state, and every block is drawn.
  const blocksShown = Number(await page.textContent('#map-blocks'));
  const drawn = await page.evaluate(() => window.mtPage.map.layout.blocks.length);
  if (blocksShown !== p.blocks || drawn !== p.blocks)
    fail(`segment map: ${blocksShown} blocks shown, ${drawn} drawn, /state says ${p.blocks}`);
  console.log(`ok: segment map ${blocksShown} blocks = /state`);

  // 4. Selecting a tag filters the event tail.
  const allTags = await page.$$eval('#tail tbody tr', (rs) => [...new Set(rs.map((r) => r.dataset.tag))]);
  if (allTags.length < 2) fail(`the unfiltered tail shows ${allTags.length} tag(s); want several`);
  await page.selectOption('#f-tag', 'activations_user');
  await waitUpdates(2);
  const tags = await page.$$eval('#tail tbody tr', (rs) => rs.map((r) => r.dataset.tag));
  if (tags.length === 0 || tags.some((t) => t !== 'activations_user'))
    fail(`tag filter: rows ${JSON.stringify([...new Set(tags)])} (${tags.length})`);
  console.log(`ok: tag filter leaves ${tags.length} activations_user rows (of tags ${allTags.join(',')})`);

  // 5. The state at the last event, rebuilt from the kept history, is the live state; a
  // state in the middle is another one.
  const live = await getJSON(base, `/map?pid=${pid}`);
  const past = await getJSON(base, `/map?pid=${pid}&seq=${live.window.last_seq}`);
  if (past.nblocks !== live.nblocks || past.allocated !== live.allocated || past.total_free !== live.total_free)
    fail(`state at the last event ${JSON.stringify([past.nblocks, past.allocated])} != live ${JSON.stringify([live.nblocks, live.allocated])}`);
  await page.evaluate((s) => window.mtPage && document.getElementById('scrub').value !== undefined &&
    (document.getElementById('scrub').value = s, document.getElementById('scrub').dispatchEvent(new Event('input'))),
  Math.floor((live.window.first_seq + live.window.last_seq) / 2));
  await waitFor('the scrubbed map', async () => (await page.textContent('#map-info')).includes('at '));
  console.log('ok: scrubbed state at the last event = live; slider shows a past state');
  await page.click('#map-live');

  // 6. The rest of the page, against /state.
  const st2 = await getJSON(base, '/state');
  const p2 = st2.processes.filter((x) => x.pid === pid).pop();
  await waitUpdates(2);
  if (!(await page.$(`#procs tr[data-pid="${pid}"] td:nth-child(3) canvas`))) fail('no sparkline for the process');
  const series = await page.evaluate(() => window.mtPage.chart.series.map((x) => x.label));
  for (const t of p2.tags.map((x) => x.name))
    if (!series.includes(t)) fail(`the chart has no series for tag ${t}: ${JSON.stringify(series)}`);
  for (const want of ['allocated (max)', 'reserved', 'peak'])
    if (!series.includes(want)) fail(`the chart has no ${want} series`);
  const tiles = await page.evaluate((q) => ({
    util: [document.getElementById('util-value').textContent, fmtPct(q.utilization)],
    frag: [document.getElementById('frag-value').textContent, fmtPct(q.fragmentation)],
    host: [document.getElementById('host-alloc-value').textContent, fmtBytes(q.host.allocated_bytes)],
  }), p2);
  for (const [k, [shownV, want]] of Object.entries(tiles))
    if (shownV !== want) fail(`${k}: the page shows ${shownV}, /state gives ${want}`);
  if (!(p2.host.allocated_bytes > 0)) fail('no pinned host memory in /state');
  await waitFor('the OOM alert', async () => (await page.textContent('#alerts')).includes(`OOM: web_producer (${pid}) 1 out-of-memory`));
  console.log(`ok: sparkline, chart series, util ${tiles.util[0]}, frag ${tiles.frag[0]}, host ${tiles.host[0]}, OOM alert`);

  // A click on a block of the map gives its details.
  const at = await page.evaluate(() => {
    const L = window.mtPage.map.layout, b = L.blocks[0];
    const px = (b.lin + b.size / 2) / L.per, row = Math.floor(px / L.W);
    const r = document.getElementById('map').getBoundingClientRect();
    return { x: r.left + px - row * L.W, y: r.top + row * L.rowH + L.rowH / 2, hex: b.hex };
  });
  await page.mouse.click(at.x, at.y);
  await waitFor('the block details', async () => {
    const t = await page.textContent('#blockinfo');
    return t.includes(`block ${at.hex}`) && t.includes('stream') && t.includes('age') && t;
  });
  console.log(`ok: block ${at.hex} clicked: details shown`);

  // Compare: A = the last 5 minutes, B = the last minute; a row per tag, what grew.
  await page.click('#set-a');
  await page.click('button[data-span="60"]');
  await waitUpdates(2);
  await page.click('#set-b');
  await waitFor('the comparison', async () => {
    const rows = await page.$$eval('#compare tbody tr', (rs) => rs.map((r) => r.cells[0].textContent));
    return rows.includes('allocated (max in range)') && p2.tags.every((t) => rows.includes(t.name)) && rows;
  });
  console.log('ok: compare A/B lists every tag and the totals');

  // The analysis panels, live: the producer's named scope with the peak the allocator
  // counted, its temporary block (by tag: no stacks), and its settings change marked on the
  // chart. The daemon refreshes them every 5 s.
  const scopePeak = Number((prodOut.match(/scope web_step peak (\d+)/) || [])[1]);
  if (!(scopePeak > 0)) fail('the producer did not say its scope\'s peak: ' + prodOut);
  await waitFor('the live scopes panel', async () => {
    const rows = await page.$$eval('#scopes tbody tr', (rs) => rs.map((r) => [...r.cells].map((c) => c.dataset.bytes || c.textContent)));
    return rows.some((r) => r[0] === 'web_step' && Number(r[2]) === scopePeak) && rows;
  }, 15000);
  // The scope's block is a temporary of the site that allocated it (the producer records
  // stacks): main at the line of that malloc.
  // A build without line info (release) names it by module+offset instead.
  const srcLines = readFileSync(join(here, 'web_producer.c'), 'utf8').split('\n');
  const lineInfo = execFileSync('readelf', ['-S', producer], { encoding: 'utf8' }).includes('.debug_info');
  const site = lineInfo
    ? `main (web_producer.c:${srcLines.findIndex((l) => l.includes('mt_alloc_malloc(a, 2u << 20')) + 1})`
    : 'main (web_producer+0x…)';
  const isSite = (name) => (lineInfo ? name === site : /^main \(web_producer\+0x[0-9a-f]+\)$/.test(name));
  let panels;
  await waitFor('the live temporary and settings panels', async () => {
    const t = await page.$$eval('#temporary tbody tr', (rs) => rs.map((r) => [r.cells[0].textContent, r.cells[2] && r.cells[2].dataset.bytes]));
    const s = await page.$$eval('#settings tbody tr', (rs) => rs.map((r) => r.cells[3] && r.cells[3].textContent));
    const marks = await page.evaluate(() => window.mtPage.settingMarks);
    panels = [t, s, marks];
    if (t.some((r) => isSite(r[0]) && Number(r[1]) >= 2 << 20) && s.includes('max_split_size_mb') && marks >= 1) return panels;
    throw new Error(`${JSON.stringify(panels)}: want a row of ${site}, max_split_size_mb, a mark`);
  }, 15000);
  console.log(`ok: live panels: scope web_step peak ${scopePeak} B, temporary blocks of ${site}, the settings change marked`);

  // Screenshot for the README, with the tag filter cleared.
  await page.selectOption('#f-tag', '');
  await waitUpdates(2);
  const shot = join(buildDir, 'web-page.png');
  await page.screenshot({ path: shot, fullPage: true });
  console.log('screenshot: ' + shot);

  // 7. The page reconnects by itself after the daemon restarts.
  daemon.proc.kill('SIGTERM');
  await waitFor('the page to notice the daemon is gone',
    async () => (await page.textContent('#status')).includes('disconnected'));
  daemon = await startDaemon(port);
  await waitFor('the page to reconnect', async () => (await page.textContent('#status')).startsWith('live'), 10000);
  console.log('ok: reconnected after a daemon restart');

  const perf = await page.evaluate(() => window.mtPage.perf);
  console.log(`page updates: ${perf.length}, max ${Math.max(...perf).toFixed(1)} ms`);
  if (errors.length) fail('errors on the page: ' + errors.join('; '));
  await browser.close();
  cleanup();
  process.exit(0);
} catch (e) {
  if (browser) await browser.close().catch(() => {});
  fail(e.stack || String(e));
}
