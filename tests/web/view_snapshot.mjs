// `memtrace view SNAPSHOT.pickle`: a PyTorch snapshot's clock is the run's own (time_us
// since the Unix epoch), so the page dates it on that day, and the header says the page
// shows a recording, not a live daemon. Checks /state and /history, then (headless
// Chromium, when it can be had) the page's header and time range.
//
//   node view_snapshot.mjs MEMTRACE SNAPSHOT
// SNAPSHOT: tests/snapshot/data/v2_torch_frames.pickle (its first event 2025-05-27 UTC).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const [memtrace, snapshot] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const FIRST_S = 1748329299.514852; // the snapshot's first time_us, in seconds
let view = null;

function fail(msg) {
  console.error('FAIL: ' + msg);
  if (view && view.exitCode === null) view.kill('SIGKILL');
  process.exit(1);
}

function serve() {
  return new Promise((resolve, reject) => {
    const p = spawn(memtrace, ['view', '--port', '0', snapshot], { stdio: ['ignore', 'ignore', 'pipe'] });
    view = p;
    let err = '';
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve(m[0]);
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

try {
  const url = await serve();
  const st = await get(url, '/state');
  if (st.daemon.recorded !== true) fail('/state does not say the daemon serves a recording');
  const p = st.processes[0];
  const reg = p.registered_realtime_ns / 1e9;
  if (Math.abs(reg - FIRST_S) > 1) fail(`process registered at ${reg}, not the snapshot's ${FIRST_S}`);
  const h = await get(url, `/history?pid=${p.pid}&buckets=20`);
  if (!(Math.abs(Number(h.from) - FIRST_S) < 1 && Number(h.to) >= Number(h.from) && Number(h.to) - FIRST_S < 60))
    fail(`/history spans ${h.from}..${h.to}: not the snapshot's clock (${FIRST_S})`);
  console.log(`ok: /state says recorded; /history spans ${h.from}..${h.to} (the snapshot's own clock)`);

  const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
  let chromium = null;
  try {
    chromium = createRequire(join(here, 'package.json'))('playwright-core').chromium;
  } catch (e) {
    console.log('note: no playwright-core (npm ci --prefix tests/web): page not loaded');
  }
  if (chromium && existsSync(chromiumPath)) {
    const browser = await chromium.launch({ executablePath: chromiumPath,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
    const page = await browser.newPage();
    await page.emulateMedia({ reducedMotion: 'reduce' });
    await page.goto(url);
    await page.waitForSelector(`#procs tr[data-pid="${p.pid}"]`, { timeout: 10000 });
    // The page picks a process by itself or on a click: click it to be sure.
    await page.click(`#procs tr[data-pid="${p.pid}"]`);
    try {
      await page.waitForFunction(() => /^recorded · .*202\d-\d\d-\d\d/.test(document.getElementById('status').textContent) &&
        /202\d-\d\d-\d\d/.test(document.getElementById('view-info').textContent), null, { timeout: 10000 });
    } catch (e) {
      const status = await page.textContent('#status'), info = await page.textContent('#view-info');
      await browser.close();
      fail(`header '${status}', time range '${info}': want 'recorded' and a 202x date`);
    }
    const status = await page.textContent('#status'), info = await page.textContent('#view-info');
    if (/\blive\b/.test(status)) fail(`the header says live for a file: '${status}'`);
    await browser.close();
    console.log(`ok: the page says '${status}', time range '${info}'`);
  } else {
    console.log('note: no chromium: page not loaded');
  }
  view.kill('SIGINT');
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
