// A real snapshot whose history was recorded after the model was built (bcrafton's, in
// tests/snapshot/data/world): 225 blocks, 1.4 GiB, are live through the whole trace, which
// never allocated them, and the file gives no frames for them. Their site is "before the
// trace, no stack recorded" in /map, /block and the legend, and a click on one says why it
// has no stack and how to record one (headless Chromium, when it can be had).
//
//   node view_before_trace.mjs MEMTRACE SNAPSHOT
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { failView, getJson as get, launchChromium, openProcess, serveView } from './view_serve.mjs';

const [memtrace, snapshot] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const BEFORE = 'before the trace, no stack recorded';
let view = null;

const fail = (msg) => failView(view, msg);

try {
  const served = await serveView(memtrace, [snapshot]);
  view = served.proc;
  const url = served.url;
  const p = (await get(url, '/state')).processes[0];
  const map = await get(url, `/map?pid=${p.pid}`);
  const old = map.blocks.filter((b) => map.sites[b[4]] === BEFORE);
  if (old.length === 0) fail(`/map names no block '${BEFORE}': sites ${JSON.stringify(map.sites)}`);
  const blk = await get(url, `/block?pid=${p.pid}&addr=${old[0][0]}`);
  const cs = blk.call_stack || {};
  if (blk.before_trace !== true || blk.allocated_t !== null || cs.site !== BEFORE || (cs.frames || []).length)
    fail(`/block of a block from before the trace: ${JSON.stringify(blk)}`);
  console.log(`ok: ${old.length} blocks of the map are '${BEFORE}'; /block ${blk.addr} says so`);

  const browser = await launchChromium(here);
  if (browser) {
    const page = await openProcess(browser, url, p.pid);
    await page.waitForFunction((s) => window.mtPage.map && window.mtPage.map.layout &&
      window.mtPage.map.layout.blocks.some((b) => b.site === s), BEFORE, { timeout: 30000 })
      .catch(() => fail(`the page's map has no block '${BEFORE}'`));
    const at = await page.evaluate((s) => {
      const L = window.mtPage.map.layout, b = L.blocks.find((x) => x.site === s);
      const x = (b.lin + b.size / 2) / L.per, row = Math.floor(x / L.W);
      return { x: x - row * L.W, y: row * L.rowH + L.rowH / 2 };
    }, BEFORE);
    await page.click('#map', { position: { x: at.x, y: at.y } });
    await page.waitForSelector('#blockinfo .callstack', { timeout: 30000 });
    const click = await page.textContent('#blockinfo');
    if (!click.includes('site ' + BEFORE) || !click.includes("allocated before the snapshot's trace began") ||
        !click.includes('_record_memory_history') || /user frame/.test(click))
      fail(`click on a block from before the trace says '${click}'`);
    const legend = await page.$$eval('#legend span.site', (xs) => xs.map((x) => x.textContent));
    if (!legend.includes(BEFORE)) fail(`the legend does not name '${BEFORE}': ${JSON.stringify(legend)}`);
    await browser.close();
    console.log(`ok: the click says '${click.slice(0, 160)}…'`);
  }
  view.kill('SIGINT');
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
