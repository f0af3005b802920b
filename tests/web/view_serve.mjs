// Shared by the tests of `memtrace view`: the server of a recording, its JSON answers, and
// headless Chromium when it can be had.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

// Starts `memtrace view --port 0 FILE...`; resolves to the address it says (with its
// #token=...) and the child process, or rejects if it exits or says nothing in 10 s (then
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
    }, 10000).unref();
  });
}

// The JSON answer to path, with the token of the address base.
export async function getJson(base, path) {
  const tok = new URLSearchParams(new URL(base).hash.slice(1)).get('token'); // #token=...
  const r = await fetch(new URL(path, base), { headers: tok ? { Authorization: 'Bearer ' + tok } : {} });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// A headless Chromium (playwright-core from dir's node_modules, $CHROMIUM or Debian's), or
// null after saying why not.
export async function launchChromium(dir) {
  const path = process.env.CHROMIUM || '/usr/bin/chromium';
  let chromium = null;
  try {
    chromium = createRequire(join(dir, 'package.json'))('playwright-core').chromium;
  } catch (e) {
    console.log('note: no playwright-core (npm ci --prefix tests/web): page not loaded');
    return null;
  }
  if (!existsSync(path)) {
    console.log('note: no chromium: page not loaded');
    return null;
  }
  return chromium.launch({ executablePath: path,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
}
