// The page's "Outside the allocator" panel in a real browser: memtraced and web_producer on a
// sim device with a modelled context (MEMTRACE_SIM_CONTEXT), a library that reports what it
// takes outside the allocator (WEB_PRODUCER_OUTSIDE_MB, "libfakenccl.so") and memory nobody
// reports (WEB_PRODUCER_UNSEEN_MB). Checks that the page shows, per device, used of total,
// memtrace's reserved bytes, the library by name, the context and "not seen", each with the
// bytes /state gives and the bytes the producer took; that the parts add up to used; and
// that the bar draws one piece per non-empty part. Saves web-outside.png in the build
// directory.
//
//   node outside.mjs MEMTRACED WEB_PRODUCER BUILD_DIR
// Exit 0 = pass, 1 = fail (the failed check is named), 77 = skipped (the reason is said).
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve as absolute } from 'node:path';
import { fileURLToPath } from 'node:url';
import { said } from './said.mjs';

const [memtraced, producer, buildDir] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const MIB = 1 << 20;
const CONTEXT_MB = 96, OUTSIDE_MB = 48, UNSEEN_MB = 16;

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
const tmp = mkdtempSync(join(tmpdir(), 'mt-web-outside-'));
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

function startDaemon() {
  return new Promise((resolve, reject) => {
    const d = spawn(memtraced, ['--foreground', '--socket', join(tmp, 'sock'), '--port', '0'],
      { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(d);
    let err = '';
    d.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve(withToken(m[0], join(tmp, 'sock')));
    });
    d.on('exit', (code) => reject(new Error(`memtraced exited (${code}): ${err}`)));
    setTimeout(() => reject(new Error('memtraced did not say where it listens: ' + err)), 10000);
  });
}

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
  const base = await startDaemon();
  const env = { ...process.env, MEMTRACE_SIM_CONTEXT: `${CONTEXT_MB}M`,
    WEB_PRODUCER_OUTSIDE_MB: String(OUTSIDE_MB), WEB_PRODUCER_UNSEEN_MB: String(UNSEEN_MB) };
  const prod = spawn(absolute(producer), [join(tmp, 'sock'), '1', '2000', '60'],
    { cwd: tmp, env, stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(prod);
  const holding = said(prod, 'holding', 60000);

  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1200 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(base, { waitUntil: 'load' });
  const pid = prod.pid;
  await page.waitForSelector(`#procs tr[data-pid="${pid}"]`, { timeout: 10000 });
  await holding; // the daemon has read every event: the figures hold still from here

  const st = await getJSON(base, '/state');
  const p = st.processes.filter((x) => x.pid === pid).pop();
  if (!p) fail('the producer is not in /state');
  const o = (p.outside || [])[0];
  if (!o) fail(`/state has no "outside" for the producer: ${JSON.stringify(Object.keys(p))}`);
  const reserved = p.devices[0].reserved_bytes;
  // What the producer did, independently of the daemon's model.
  const want = { reserved, lib: OUTSIDE_MB * MIB, context: CONTEXT_MB * MIB, not_seen: UNSEEN_MB * MIB };
  const used = reserved + want.lib + want.context + want.not_seen;
  if (o.used !== used) fail(`/state used ${o.used}, the producer took ${used}`);

  // The panel, once the page has drawn this state.
  const panel = await waitFor('the outside panel with the producer\'s figures', () => page.evaluate(() => {
    const d = document.querySelector('#outside .outside-dev[data-device="0"]');
    if (!d || document.getElementById('outside-box').hidden) return null;
    const rows = [...d.querySelectorAll('tr')].map((r) => ({ part: r.dataset.part, name: r.dataset.name,
      bytes: Number(r.dataset.bytes), text: r.textContent }));
    return { used: Number(d.querySelector('.o-used').dataset.bytes), usedText: d.querySelector('.o-used').textContent,
      total: Number(d.querySelector('.o-total').dataset.bytes), totalText: d.querySelector('.o-total').textContent,
      outside: Number(d.querySelector('.o-outside').dataset.bytes),
      pieces: d.querySelectorAll('.outside-bar i').length, rows };
  }).then((x) => (x && x.used === used ? x : null)), 15000);

  const fmt = (b) => page.evaluate((x) => fmtBytes(x), b);
  if (panel.usedText !== await fmt(used) || panel.total !== o.total || panel.totalText !== await fmt(o.total))
    fail(`head: used ${panel.usedText}, total ${panel.totalText}; want ${await fmt(used)} of ${await fmt(o.total)}`);
  if (panel.outside !== used - reserved) fail(`outside ${panel.outside}, want ${used - reserved}`);
  const row = (part, name) => panel.rows.find((r) => r.part === part && (name == null || r.name === name));
  const checks = [['reserved', null, want.reserved], ['library', 'libfakenccl.so', want.lib],
    ['context', null, want.context], ['not_seen', null, want.not_seen], ['used', null, used]];
  for (const [part, name, bytes] of checks) {
    const r = row(part, name);
    if (!r) fail(`no ${part} ${name || ''} row: ${JSON.stringify(panel.rows)}`);
    if (r.bytes !== bytes || !r.text.includes(await fmt(bytes)))
      fail(`${part} ${name || ''}: shows ${r.bytes} "${r.text}", want ${bytes} (${await fmt(bytes)})`);
  }
  if (!row('library', 'libfakenccl.so').text.includes('libfakenccl.so')) fail('the library is not named');
  const parts = panel.rows.filter((r) => r.part !== 'used');
  const sum = parts.reduce((s, r) => s + r.bytes, 0);
  if (sum !== used) fail(`the parts add up to ${sum}, not used ${used}: ${JSON.stringify(parts)}`);
  const nonEmpty = parts.filter((r) => r.bytes > 0).length;
  if (panel.pieces !== nonEmpty) fail(`the bar has ${panel.pieces} pieces for ${nonEmpty} non-empty parts`);
  console.log(`ok: device 0 used ${panel.usedText} of ${panel.totalText} = ` +
    parts.map((r) => `${r.name || r.part} ${r.bytes}`).join(' + '));

  const shot = join(buildDir, 'web-outside.png');
  const box = await page.$('#outside-box');
  await box.screenshot({ path: shot });
  console.log('screenshot: ' + shot);
  if (errors.length) fail('errors on the page: ' + errors.join('; '));
  await browser.close();
  cleanup();
  process.exit(0);
} catch (e) {
  if (browser) await browser.close().catch(() => {});
  fail(e.stack || String(e));
}
