// The web page of `memtrace view` on a large snapshot, in headless Chromium: time from
// opening the page to its header saying 'recorded' with the file's dates (its data drawn),
// then whether it stays interactive: the longest main-thread task (PerformanceObserver
// 'longtask') and the frame latency of a click on the process row afterwards.
//   node bench/view_page.mjs URL PID      (playwright-core from npm ci --prefix tests/web)
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const [url, pid] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
let chromium;
try {
  chromium = createRequire(join(here, '..', 'tests', 'web', 'package.json'))('playwright-core').chromium;
} catch (e) {
  console.log('SKIP: playwright-core is not installed: npm ci --prefix tests/web');
  process.exit(77);
}
if (!existsSync(chromiumPath)) {
  console.log(`SKIP: no chromium at ${chromiumPath}`);
  process.exit(77);
}
const browser = await chromium.launch({ executablePath: chromiumPath,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
try {
  const page = await browser.newPage();
  await page.addInitScript(() => {
    window.__long = 0;
    try {
      new PerformanceObserver((l) => {
        for (const e of l.getEntries()) window.__long = Math.max(window.__long, e.duration);
      }).observe({ type: 'longtask', buffered: true });
    } catch (e) { /* no longtask API */ }
  });
  const t0 = Date.now();
  await page.goto(url);
  await page.waitForSelector(`#procs tr[data-pid="${pid}"]`, { timeout: 120000 });
  await page.click(`#procs tr[data-pid="${pid}"]`);
  await page.waitForFunction(() => /^recorded/.test(document.getElementById('status').textContent) &&
    /\d\d\d\d-\d\d-\d\d/.test(document.getElementById('view-info').textContent), null, { timeout: 120000 });
  const load = (Date.now() - t0) / 1000;
  await page.waitForTimeout(2000); // let the panels fetch and draw
  const clicks = [];
  for (let i = 0; i < 5; i++) {
    const t = Date.now();
    await page.click(`#procs tr[data-pid="${pid}"]`);
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))));
    clicks.push(Date.now() - t);
  }
  const longest = await page.evaluate(() => window.__long);
  console.log(JSON.stringify({ load_s: load, longest_task_ms: Math.round(longest),
    click_to_frame_ms_max: Math.max(...clicks) }));
} finally {
  await browser.close();
}
