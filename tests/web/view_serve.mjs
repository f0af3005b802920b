// Shared by the tests of `memtrace view`: the server of a recording and its JSON answers
// (headless Chromium: chromium.mjs).
import { spawn } from 'node:child_process';

// Says msg as the failure, kills the server view (if it runs) and exits 1.
export function failView(view, msg) {
  console.error('FAIL: ' + msg);
  if (view && view.exitCode === null) view.kill('SIGKILL');
  process.exit(1);
}

// Starts `memtrace view --port 0 FILE...`; resolves to the address it says (with its
// #token=...) and the child process, or rejects if it exits or says nothing in 30 s (then
// it is killed).
export function serveView(memtrace, files) {
  return new Promise((resolve, reject) => {
    const p = spawn(memtrace, ['view', '--port', '0', ...files], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = err.match(/http:\/\/\S+/);
      if (m) resolve({ url: m[0], proc: p });
    });
    p.on('exit', (code) => reject(new Error(`memtrace view exited (${code}): ${err}`)));
    setTimeout(() => {
      p.kill('SIGKILL');
      reject(new Error('memtrace view did not say where it listens: ' + err));
    }, 30000).unref();
  });
}

// The JSON answer to path, with the token of the address base.
export async function getJson(base, path) {
  const tok = new URLSearchParams(new URL(base).hash.slice(1)).get('token'); // #token=...
  const r = await fetch(new URL(path, base), { headers: tok ? { Authorization: 'Bearer ' + tok } : {} });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// A new page of browser at url, with process pid's row waited for and clicked (the page
// picks a process by itself or on a click: clicked to be sure).
export async function openProcess(browser, url, pid) {
  const page = await browser.newPage();
  await page.emulateMedia({ reducedMotion: 'reduce' });
  await page.goto(url);
  await page.waitForSelector(`#procs tr[data-pid="${pid}"]`, { timeout: 30000 });
  await page.click(`#procs tr[data-pid="${pid}"]`);
  return page;
}

export { launchChromium } from './chromium.mjs';
