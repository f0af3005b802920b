// `memtrace view LOG`: a run recorded by the daemon's --log, served again. Checks that the
// figures of the live daemon at the run's end are those the view serves, that the page
// (headless Chromium, when it can be had) lists the process with its segment map, and that
// a malformed line is named on stderr and makes the exit status 2 after Ctrl-C; and that a
// PyTorch snapshot is served as one process with the figures `memtrace report` gives it.
//
//   node view.mjs MEMTRACED MEMTRACE WEB_PRODUCER SOURCE_ROOT
import { execFileSync, spawn } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve as absolute } from 'node:path';
import { fileURLToPath } from 'node:url';
import { said } from './said.mjs';

const [memtraced, memtrace, producer, srcRoot] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'mt-view-'));
const children = [];

function fail(msg) {
  console.error('FAIL: ' + msg);
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
  process.exit(1);
}

// Starts a server that says its URL on stderr; resolves with {proc, url, err()}.
function serve(cmd, args) {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(p);
    let err = '';
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (!m) return;
      const u = new URL(m[0]);
      const sock = args.includes('--socket') ? args[args.indexOf('--socket') + 1] : null;
      if (!new URLSearchParams(u.hash.slice(1)).get('token') && sock && existsSync(sock + '.token'))
        u.hash = 'token=' + readFileSync(sock + '.token', 'utf8').trim();
      resolve({ proc: p, url: u.toString(), err: () => err });
    });
    p.on('exit', (code) => reject(new Error(`${cmd} exited (${code}): ${err}`)));
    setTimeout(() => reject(new Error(`${cmd} did not say where it listens: ${err}`)), 10000);
  });
}
// The token of a page address (#token=..., as `memtrace view` prints it), or null.
const tokenOf = (base) => new URLSearchParams(new URL(base).hash.slice(1)).get('token');
const auth = (base) => (tokenOf(base) ? { Authorization: 'Bearer ' + tokenOf(base) } : {});
const get = async (base, path) => {
  const r = await fetch(new URL(path, base), { headers: auth(base) });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
};
const exited = (p) => new Promise((r) => (p.exitCode !== null ? r(p.exitCode) : p.on('exit', r)));

try {
  const log = join(tmp, 'run.ndjson');
  const d = await serve(memtraced, ['--foreground', '--socket', join(tmp, 'sock'), '--port', '0', '--log', log]);
  // Churns 1.5 s, then holds its blocks (killed below, long before the 60 s are up).
  // In tmp: once the daemon is stopped below, the producer takes over into a local log
  // in its working directory, which must not be the build tree.
  const prod = spawn(absolute(producer), [join(tmp, 'sock'), '1.5', '3000', '60'], { cwd: tmp, stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(prod);
  await said(prod, 'holding', 40000); // the figures are still from here on
  const live = (await get(d.url, '/state')).processes.find((p) => p.pid === prod.pid);
  if (!live || !(live.allocated_bytes > 0)) fail('the producer is not live in the daemon');
  d.proc.kill('SIGTERM'); // the log ends with the blocks held
  await exited(d.proc);
  prod.kill('SIGKILL');
  appendFileSync(log, '{"v":1,"type":"event" this is not JSON\n');

  const v = await serve(memtrace, ['view', '--port', '0', log]);
  const st = await get(v.url, '/state');
  const p = st.processes.find((x) => x.pid === prod.pid);
  if (!p) fail('the view does not list the process');
  for (const k of ['allocated_bytes', 'reserved_bytes', 'peak_allocated_bytes', 'blocks', 'events'])
    if (p[k] !== live[k]) fail(`view ${k} ${p[k]} != live ${live[k]}`);
  const map = await get(v.url, `/map?pid=${p.pid}`);
  if (map.nblocks !== p.blocks) fail(`view map ${map.nblocks} blocks, /state ${p.blocks}`);
  const hist = await get(v.url, `/history?pid=${p.pid}&buckets=20`);
  if (hist.alast[19] !== p.allocated_bytes) fail(`history ends at ${hist.alast[19]}, not ${p.allocated_bytes}`);
  console.log(`ok: view serves ${p.events} events, allocated ${p.allocated_bytes}, ${p.blocks} blocks as live`);

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
    await page.goto(v.url);
    await page.waitForSelector(`#procs tr[data-pid="${p.pid}"]`, { timeout: 10000 });
    await page.waitForFunction((n) => document.getElementById('map-blocks').textContent === String(n), p.blocks, { timeout: 10000 });
    await browser.close();
    console.log('ok: the page lists the recorded process with its segment map');
  }

  v.proc.kill('SIGINT');
  const code = await exited(v.proc);
  if (code !== 2) fail(`view exited ${code} after Ctrl-C with a malformed line; want 2`);
  if (!/1 malformed line\(s\) skipped; the first: .*run\.ndjson:\d+/.test(v.err())) fail('stderr does not name the malformed line: ' + v.err());
  console.log('ok: the malformed line is named, exit status 2');

  // A PyTorch snapshot: one process, named after the file, with the report's figures.
  const snap = join(srcRoot, 'tests', 'snapshot', 'data', 'v2_all_actions_p4.pickle');
  const rep = JSON.parse(execFileSync(memtrace, ['report', '--json', snap], { encoding: 'utf8' })).processes[0];
  const vs = await serve(memtrace, ['view', '--port', '0', snap]);
  const sp = (await get(vs.url, '/state')).processes;
  if (sp.length !== 1 || sp[0].name !== 'v2_all_actions_p4.pickle')
    fail(`the snapshot's view lists ${JSON.stringify(sp.map((x) => x.name))}`);
  const want = { events: rep.events, peak_allocated_bytes: rep.peak_allocated, allocated_bytes: rep.final_allocated };
  for (const [k, w] of Object.entries(want))
    if (sp[0][k] !== w) fail(`snapshot view ${k} ${sp[0][k]} != report ${w}`);
  const smap = await get(vs.url, `/map?pid=${sp[0].pid}`);
  if (smap.nblocks !== sp[0].blocks) fail(`snapshot map ${smap.nblocks} blocks, /state ${sp[0].blocks}`);
  vs.proc.kill('SIGINT');
  if ((await exited(vs.proc)) !== 0) fail('view of a snapshot did not exit 0 after Ctrl-C');
  console.log(`ok: a snapshot is served as one process: ${sp[0].events} events, peak ${sp[0].peak_allocated_bytes} as the report`);

  // Security: a non-local --host says what it exposes; no answer carries a CORS header.
  const open = await serve(memtraced, ['--foreground', '--socket', join(tmp, 'sock2'), '--port', '0', '--host', '0.0.0.0']);
  if (!/warning: HTTP on 0\.0\.0\.0 is reachable from other hosts: .*every process/.test(open.err()))
    fail('no warning for a non-local --host: ' + open.err());
  for (const path of ['/', '/app.js', '/state', '/spark', '/metrics']) {
    const r = await fetch(new URL(path, open.url), { headers: { Origin: 'http://evil.example', ...auth(open.url) } });
    if (r.headers.get('access-control-allow-origin') !== null) fail(`${path} answers with a CORS header`);
  }
  open.proc.kill('SIGTERM');
  await exited(open.proc);
  console.log('ok: non-local --host warns; no CORS header');
  rmSync(tmp, { recursive: true, force: true });
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
