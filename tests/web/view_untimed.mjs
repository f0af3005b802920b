// `memtrace view SNAPSHOT.pickle` of a trace with no clock (PyTorch wrote no time_us before
// its trace entries had one): the page counts events where it would show times. Its events
// stand event_ns apart from 0 on the time axis (/state says event_ns), so the charts have
// one point per few events instead of every event at one instant, and no lifetimes are
// told (every block would read as freed within 1 ms). Checks /state, /history, /analysis
// and /sites, then (headless Chromium, when it can be had) the header, time range, chart,
// event tail and temporary-allocation table.
//
//   node view_untimed.mjs MEMTRACE SNAPSHOT
// SNAPSHOT: tests/snapshot/data/v2_untimed.pickle (24 trace entries on 2 devices).
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { failView, getJson as get, launchChromium, openProcess, serveView } from './view_serve.mjs';

const [memtrace, snapshot] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const EVENTS = 24;
let view = null;

const fail = (msg) => failView(view, msg);

try {
  const served = await serveView(memtrace, [snapshot]);
  view = served.proc;
  const url = served.url;
  const st = await get(url, '/state');
  const p = st.processes[0];
  if (!(p.event_ns > 0)) fail(`/state gives no event_ns for a trace without times: ${JSON.stringify(p)}`);
  const step = p.event_ns / 1e9; // seconds per event on the axis
  const h = await get(url, `/history?pid=${p.pid}&buckets=20`);
  const from = Number(h.from), to = Number(h.to);
  // Not one instant (the old answer: every event a nanosecond apart on this machine's
  // clock), not a date: events 1..EVENTS, event_ns apart from 0.
  if (!(from >= 0 && from <= step && Math.abs(to - EVENTS * step) <= step))
    fail(`/history spans ${h.from}..${h.to}: want events 1..${EVENTS} at ${step} s each`);
  const a = await get(url, `/analysis?pid=${p.pid}`);
  if (!Array.isArray(a.temporary) || a.temporary.length !== 0)
    fail(`/analysis tells temporary allocations without a clock: ${JSON.stringify(a.temporary)}`);
  const sites = await get(url, `/sites?pid=${p.pid}`);
  if (sites.by_time !== false) fail(`/sites says by_time ${sites.by_time} for a trace without times`);
  console.log(`ok: event_ns ${p.event_ns}; /history spans ${h.from}..${h.to}; no temporaries; /sites by event`);

  const browser = await launchChromium(here);
  if (browser) {
    const page = await openProcess(browser, url, p.pid);
    try {
      await page.waitForFunction(() => /no clock/.test(document.getElementById('status').textContent) &&
        /^to the end, event \d+ – event \d+ \(the file has no clock/.test(document.getElementById('view-info').textContent) &&
        window.mtPage.chart && window.mtPage.chart.data[0].length > 2 &&
        /^event \d+$/.test((document.querySelector('#tail tbody tr td:nth-child(2)') || {}).textContent || '') &&
        /no clock/.test(document.getElementById('temp-info').textContent), null, { timeout: 30000 });
    } catch (e) {
      const got = await page.evaluate(() => ({
        status: document.getElementById('status').textContent,
        range: document.getElementById('view-info').textContent,
        points: window.mtPage.chart ? window.mtPage.chart.data[0].length : null,
        tail: (document.querySelector('#tail tbody tr td:nth-child(2)') || {}).textContent,
        temp: document.getElementById('temp-info').textContent }));
      await browser.close();
      fail(`the page does not count events: ${JSON.stringify(got)}`);
    }
    const got = await page.evaluate(() => ({
      range: document.getElementById('view-info').textContent,
      points: window.mtPage.chart.data[0].length,
      time: window.mtPage.chart.scales.x.time }));
    if (got.time !== false) fail('the chart still has a time axis (dates) for a trace without times');
    await browser.close();
    console.log(`ok: the page says '${got.range}', ${got.points} chart points on an event axis`);
  }
  view.kill('SIGINT');
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
