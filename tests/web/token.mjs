// The page's token never becomes a cookie. A cookie for 127.0.0.1 goes with every request to
// 127.0.0.1 on any port, so another local user's web server would receive it as soon as the
// owner's browser visited it. In headless Chromium, against a real memtraced:
//   1. an older link (/?token=T) works, sets no cookie and leaves the address bar; a server
//      on another port of 127.0.0.1 the same browser then visits receives neither a cookie
//      nor the token (the cookie the daemon used to set went there);
//   2. the page opened as http://127.0.0.1:PORT/#token=T lists the process; the token leaves
//      the address bar; every data request carries it as "Authorization: Bearer", never in
//      the URL; no answer has a Set-Cookie header; the browser holds no cookie;
//   3. a reload without the fragment still works (sessionStorage, per origin and tab);
//   4. the server on another port again receives neither cookie nor token;
//   5. a new tab without the token gets 401s and says the token is required.
//
//   node token.mjs MEMTRACED WEB_PRODUCER
// Exit 0 = pass, 1 = fail (the failed check is named), 77 = skipped (the reason is said).
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve as absolute } from 'node:path';
import { fileURLToPath } from 'node:url';

const [memtraced, producer] = process.argv.slice(2);
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
const tmp = mkdtempSync(join(tmpdir(), 'mt-token-'));
let browser = null;
let other = null;

function cleanup() {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  if (other) other.close();
  rmSync(tmp, { recursive: true, force: true });
}
function fail(msg) {
  console.error('FAIL: ' + msg);
  cleanup();
  process.exit(1);
}

try {
  const sock = join(tmp, 'sock');
  const d = spawn(memtraced, ['--foreground', '--socket', sock, '--port', '0'],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(d);
  const base = await new Promise((resolve, reject) => {
    let err = '';
    d.stderr.on('data', (b) => { err += b; const m = err.match(/http:\/\/\S+/); if (m) resolve(m[0]); });
    d.on('exit', (code) => reject(new Error(`memtraced exited (${code}): ${err}`)));
    setTimeout(() => reject(new Error('memtraced did not say where it listens: ' + err)), 10000);
  });
  if (!existsSync(sock + '.token')) fail('the daemon made no token file');
  const tok = readFileSync(sock + '.token', 'utf8').trim();
  const origin = new URL(base).origin;

  // The other server: another local user's, on another port of the same address.
  const seen = [];
  other = createServer((req, res) => {
    seen.push({ url: req.url, headers: req.headers });
    res.writeHead(200, { 'Content-Type': 'text/html' });
    res.end('<!doctype html><title>another server</title>');
  });
  await new Promise((r) => other.listen(0, '127.0.0.1', r));
  const otherUrl = `http://127.0.0.1:${other.address().port}/`;

  const prod = spawn(absolute(producer), [sock, '30', '500'], { cwd: tmp, stdio: ['ignore', 'ignore', 'inherit'] });
  children.push(prod);

  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const ctx = await browser.newContext(), ctxOld = await browser.newContext();
  const page = await ctx.newPage();
  const errors = [], setCookies = [], dataRequests = [];
  const watch = (pg) => {
    pg.on('pageerror', (e) => errors.push(e.message));
    pg.on('response', async (r) => {
      if (!r.url().startsWith(origin)) return;
      const h = await r.allHeaders();
      if (h['set-cookie'] !== undefined) setCookies.push(`${r.url()}: ${h['set-cookie']}`);
    });
  };
  watch(page);
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.origin !== origin || r.resourceType() !== 'fetch') return;
    dataRequests.push({ path: u.pathname + u.search, auth: r.headers()['authorization'] });
  });

  // What another local user's server on another port of the address receives.
  const otherGot = async (pg, what) => {
    const n0 = seen.length;
    await pg.goto(otherUrl, { waitUntil: 'load' });
    await pg.goto(otherUrl + 'x', { waitUntil: 'load' });
    if (seen.length < n0 + 2) fail('the other server was not visited');
    for (const s of seen.slice(n0)) {
      if (s.headers.cookie !== undefined) fail(`${what}: the server on another port got a cookie: ${s.headers.cookie}`);
      if (JSON.stringify(s).includes(tok)) fail(`${what}: the server on another port got the token: ${JSON.stringify(s)}`);
    }
  };

  // 1. An older link, the token in the query (a browser session of its own): the page
  // works, sets no cookie, leaves the address bar, and the owner's browser then visiting
  // a server on another port sends it neither cookie nor token.
  const old = await ctxOld.newPage();
  watch(old);
  await old.goto(`${origin}/?token=${tok}`, { waitUntil: 'load' });
  await old.waitForSelector(`#procs tr[data-pid="${prod.pid}"]`, { timeout: 15000 });
  await otherGot(old, 'after an old ?token= link');
  if (setCookies.length) fail('answers set cookies: ' + setCookies.join('; '));
  if ((await ctxOld.cookies()).length) fail('the browser holds cookies: ' + JSON.stringify(await ctxOld.cookies()));
  await old.goBack({ waitUntil: 'load' });
  await old.goBack({ waitUntil: 'load' });
  if (old.url().includes('token')) fail(`an old ?token= link stays in the history: ${old.url()}`);
  console.log('ok: an old ?token= link sets no cookie, is scrubbed, and another port gets nothing');

  // 2. The page, with the token in the fragment.
  await page.goto(`${origin}/#token=${tok}`, { waitUntil: 'load' });
  await page.waitForSelector(`#procs tr[data-pid="${prod.pid}"]`, { timeout: 15000 });
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('live'), null, { timeout: 10000 });
  if (page.url().includes(tok) || page.url().includes('token')) fail(`the address bar still holds the token: ${page.url()}`);
  const stored = await page.evaluate(() => sessionStorage.getItem('memtrace_token'));
  if (stored !== tok) fail(`sessionStorage holds ${JSON.stringify(stored)}, not the token`);
  if (dataRequests.length === 0) fail('the page made no data request');
  for (const r of dataRequests) {
    if (r.path.includes(tok) || /[?&]token=/.test(r.path)) fail(`a request carries the token in its URL: ${r.path}`);
    if (r.auth !== `Bearer ${tok}`) fail(`${r.path} went without "Authorization: Bearer <token>" (${r.auth})`);
  }
  if (setCookies.length) fail('answers set cookies: ' + setCookies.join('; '));
  if ((await ctx.cookies()).length) fail('the browser holds cookies: ' + JSON.stringify(await ctx.cookies()));
  console.log(`ok: process ${prod.pid} listed from #token=; ${dataRequests.length} requests with the Bearer header, none with the token in the URL; no Set-Cookie; the address bar scrubbed`);

  // 3. A reload without the fragment: the token comes from sessionStorage.
  const before = dataRequests.length;
  await page.reload({ waitUntil: 'load' });
  await page.waitForSelector(`#procs tr[data-pid="${prod.pid}"]`, { timeout: 15000 });
  if (!(dataRequests.length > before)) fail('no request after the reload');
  console.log('ok: a reload without the fragment still reads the daemon');

  // 4. The same browser visits the server on another port.
  await otherGot(page, 'after #token=');
  console.log(`ok: a server on another port got ${seen.length} requests with no cookie and no token`);

  // 5. Another tab of a fresh browser session without the token: 401, said.
  const ctx2 = await browser.newContext();
  const p2 = await ctx2.newPage();
  const statuses = [];
  p2.on('response', (r) => { if (new URL(r.url()).pathname === '/state') statuses.push(r.status()); });
  await p2.goto(`${origin}/`, { waitUntil: 'load' });
  await p2.waitForFunction(() => document.getElementById('status').textContent.includes('token required'), null, { timeout: 10000 });
  if (!statuses.length || statuses.some((s) => s !== 401)) fail(`/state without the token answered ${statuses}`);
  if ((await p2.$$('#procs tbody tr')).length) fail('a page without the token lists processes');
  console.log('ok: without the token the page gets 401 and says the token is required');

  if (errors.length) fail('errors on the page: ' + errors.join('; '));
  await browser.close();
  browser = null;
  cleanup();
  process.exit(0);
} catch (e) {
  if (browser) await browser.close().catch(() => {});
  fail(e.stack || String(e));
}
