// Shared by the web tests: waiting for what a child process says, never sleeping.

// Resolves once proc says `line` on stdout (web_producer's "holding": the daemon has read
// every event it recorded, and its figures hold still); rejects if proc exits first or
// after ms, a deadline far beyond what any load needs. Awaiting it later is safe: the
// rejection is not reported as unhandled meanwhile.
export function said(proc, line, ms) {
  const p = new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (b) => {
      out += b.toString();
      if (out.split('\n').includes(line)) resolve();
    });
    proc.on('exit', (code) => reject(new Error(`the producer exited (${code}) before saying "${line}"`)));
    setTimeout(() => reject(new Error(`the producer did not say "${line}" in ${ms} ms`)), ms).unref();
  });
  p.catch(() => {});
  return p;
}
