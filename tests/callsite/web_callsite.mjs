// The call sites on the web page, through `memtrace view` of a log with a known stack
// table (written by test_callsite_e2e.py): /state lists the top call sites with names,
// /callsites answers now and at a past event, /block gives a block's call stack; in
// headless Chromium, clicking the weights' block shows its stack, and the compare view
// lists bytes by call site.
//
//   node web_callsite.mjs MEMTRACE LOG    (exit 77: no playwright-core or chromium)
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const [memtrace, log] = process.argv.slice(2);
const webdir = join(dirname(fileURLToPath(import.meta.url)), '..', 'web');
let view = null;

function fail(msg) {
  console.error('FAIL: ' + msg);
  if (view && view.exitCode === null) view.kill('SIGKILL');
  process.exit(1);
}

function serve() {
  return new Promise((resolve, reject) => {
    const p = spawn(memtrace, ['view', '--port', '0', log], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve({ proc: p, url: m[0] });
    });
    p.on('exit', (code) => reject(new Error(`memtrace view exited (${code}): ${err}`)));
    setTimeout(() => reject(new Error('memtrace view did not say where it listens: ' + err)), 10000);
  });
}

const get = async (base, path) => {
  const tok = new URLSearchParams(new URL(base).hash.slice(1)).get('token'); // #token=...
  const r = await fetch(new URL(path, base), { headers: tok ? { Authorization: 'Bearer ' + tok } : {} });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
};
const labels = (row) => (row.frames || []).map((f) => f.label);

try {
  const v = await serve();
  view = v.proc;
  const st = await get(v.url, '/state');
  const p = st.processes[0];
  const top = p.callsites || [];
  if (!top.length || !top[0].site.startsWith('load_weights (prog_sites.c:'))
    fail('/state call sites: ' + JSON.stringify(top));
  if (labels(top[0])[1] !== undefined && !labels(top[0])[1].startsWith('main (prog_sites.c:'))
    fail('/state: the caller of load_weights is not main: ' + labels(top[0]));
  const now = await get(v.url, `/callsites?pid=${p.pid}`);
  if (!now.live || now.callsites[0].site !== top[0].site) fail('/callsites now: ' + JSON.stringify(now));
  const map = await get(v.url, `/map?pid=${p.pid}`);
  const w = map.blocks.find((b) => b[1] === 8 << 20);
  if (!w) fail('no 8 MiB block in the map');
  const blk = await get(v.url, `/block?pid=${p.pid}&addr=${w[0]}`);
  if (!blk.call_stack || !labels(blk.call_stack)[0].startsWith('load_weights (prog_sites.c:'))
    fail('/block call_stack: ' + JSON.stringify(blk));
  // At the window's first events nothing but the weights can be live.
  const past = await get(v.url, `/callsites?pid=${p.pid}&seq=${map.window.first_seq + 2}`);
  if (past.live || past.callsites.some((c) => c.bytes > (8 << 20))) fail('/callsites in the past: ' + JSON.stringify(past));
  console.log(`ok: /state, /callsites and /block name load_weights (${top[0].site})`);

  let chromium = null;
  const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
  try {
    chromium = createRequire(join(webdir, 'package.json'))('playwright-core').chromium;
  } catch (e) {
    console.log('skip: no playwright-core (npm ci --prefix tests/web)');
  }
  if (!chromium || !existsSync(chromiumPath)) {
    view.kill('SIGINT');
    process.exit(77);
  }
  const browser = await chromium.launch({ executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text() + ' ' + JSON.stringify(m.location())); });
  await page.goto(v.url);
  await page.waitForSelector(`#procs tr[data-pid="${p.pid}"]`, { timeout: 10000 });
  await page.click(`#procs tr[data-pid="${p.pid}"]`);
  await page.waitForFunction((n) => document.getElementById('map-blocks').textContent === String(n),
    map.nblocks, { timeout: 10000 });
  // Where the weights' block is drawn: the page's own layout of the map.
  const at = await page.evaluate((hex) => {
    const L = S.map.layout, b = L.blocks.find((k) => k.hex === hex);
    const x = b.lin / L.per + Math.min(5, b.size / L.per / 2), row = Math.floor(x / L.W);
    const r = document.getElementById('map').getBoundingClientRect();
    return { x: r.left + x - row * L.W, y: r.top + row * L.rowH + L.rowH / 2 };
  }, w[0]);
  await page.mouse.click(at.x, at.y);
  await page.waitForFunction(() => /load_weights \(prog_sites\.c:\d+\)/.test(document.getElementById('blockinfo').textContent),
    null, { timeout: 10000 }).catch(() => null);
  const info = await page.textContent('#blockinfo');
  if (!/call stack 1/.test(info) || !/load_weights \(prog_sites\.c:\d+\)/.test(info) || !/main \(prog_sites\.c:\d+\)/.test(info))
    fail('the block panel does not show the call stack: ' + info);
  console.log('ok: clicking the weights block shows its call stack');
  // Two ranges of the recorded run (A: its first half, B: all of it), compared as the
  // page's A/B buttons do; awaited, so that a failure in the page comes back with its message.
  const h = await get(v.url, `/history?pid=${p.pid}&buckets=10`);
  await page.evaluate(async ({ pid, from, to }) => {
    S.cmp.a = { pid, from, to: from + (to - from) / 2 };
    S.cmp.b = { pid, from, to };
    await renderCompare();
  }, { pid: p.pid, from: h.from, to: h.to }).catch((e) => fail('the compare view failed: ' + e));
  await page.waitForFunction(() => document.querySelectorAll('#compare-sites tbody tr').length > 0, null, { timeout: 20000 })
    .catch(() => fail('the compare view stays empty; page errors: ' + errors.join(' | ')));
  const rows = await page.$$eval('#compare-sites tbody tr', (trs) => trs.map((t) => t.textContent));
  if (!rows.some((r) => r.includes('load_weights (prog_sites.c:') && /8\.0+ MiB/.test(r)))
    fail('the compare view has no call-site row for the weights: ' + rows);
  console.log('ok: the compare view lists bytes by call site');
  await browser.close();
  view.kill('SIGINT');
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
