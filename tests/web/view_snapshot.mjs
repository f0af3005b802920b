// `memtrace view SNAPSHOT.pickle`: a PyTorch snapshot's clock is the run's own (time_us
// since the Unix epoch), so the page dates it on that day, and the header says the page
// shows a recording, not a live daemon. A snapshot has no tags: its blocks are coloured by
// their site (the user's frame of each stack, analysis/frames.c), with a timeline of live
// bytes by site, and a block's hover and click name its user frame and filtered stack.
// Checks /state, /history, /map, /sites and /block, then (headless Chromium, when it can be
// had) the page's header, time range, map colours, legend, site chart and block text.
//
//   node view_snapshot.mjs MEMTRACE SNAPSHOT
// SNAPSHOT: tests/snapshot/data/v2_torch_frames.pickle (its first event 2025-05-27 UTC).
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { failView, getJson as get, launchChromium, openProcess, serveView } from './view_serve.mjs';

const [memtrace, snapshot] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const FIRST_S = 1748329299.514852; // the snapshot's first time_us, in seconds
let view = null;

const fail = (msg) => failView(view, msg);

try {
  const served = await serveView(memtrace, [snapshot]);
  view = served.proc;
  const url = served.url;
  const st = await get(url, '/state');
  if (st.daemon.recorded !== true) fail('/state does not say the daemon serves a recording');
  const p = st.processes[0];
  const reg = p.registered_realtime_ns / 1e9;
  if (Math.abs(reg - FIRST_S) > 1) fail(`process registered at ${reg}, not the snapshot's ${FIRST_S}`);
  const h = await get(url, `/history?pid=${p.pid}&buckets=20`);
  if (!(Math.abs(Number(h.from) - FIRST_S) < 1 && Number(h.to) >= Number(h.from) && Number(h.to) - FIRST_S < 60))
    fail(`/history spans ${h.from}..${h.to}: not the snapshot's clock (${FIRST_S})`);
  console.log(`ok: /state says recorded; /history spans ${h.from}..${h.to} (the snapshot's own clock)`);
  // The snapshot spans 6 ms, as one training step's often spans under a second: the
  // history's buckets are fitted to it, so that the device chart shows its rises and falls
  // (with the live daemon's 250 ms buckets it was one step of two values).
  const hf = await get(url, `/history?pid=${p.pid}&buckets=100`);
  const levels = new Set(hf.amax.filter((x) => x != null));
  if (levels.size < 5 || Number(hf.from) < FIRST_S - 0.001)
    fail(`/history of a 6 ms snapshot has ${levels.size} levels from ${hf.from}: not fitted to its span`);
  console.log(`ok: /history over the snapshot's 6 ms: ${levels.size} levels of allocated`);

  // The fixture's stacks: PyTorch's C++ frames ("??" files) first, then transformer.py:54
  // forward (three blocks), my_utils.py:7 scale, train.py:30 train_step.
  const SITE_RE = /^[\w.-]+\.py:\d+ \S+$/;
  const map = await get(url, `/map?pid=${p.pid}`);
  if (!Array.isArray(map.sites) || !map.sites.includes('transformer.py:54 forward'))
    fail(`/map names no site 'transformer.py:54 forward': ${JSON.stringify(map.sites)}`);
  const siteOf = map.blocks.map((b) => map.sites[b[4]]);
  if (new Set(siteOf).size < 2 || siteOf.some((x) => x === undefined))
    fail(`/map's blocks are not all given a site, or all the same one: ${JSON.stringify(siteOf)}`);
  const sites = await get(url, `/sites?pid=${p.pid}`);
  const top = sites.sites[0];
  if (top.name !== 'transformer.py:54 forward' || !(top.peak > 0) || sites.t.length < 2 ||
      sites.bytes.length !== sites.sites.length || Math.abs(sites.t[0] - FIRST_S) > 1 ||
      Math.max(...sites.bytes[0]) !== top.peak)
    fail(`/sites: ${JSON.stringify(sites).slice(0, 400)}`);
  const blk = await get(url, `/block?pid=${p.pid}&addr=${map.blocks[0][0]}`);
  const cs = blk.call_stack || {};
  if (!SITE_RE.test(cs.site || '') || !cs.frames || !cs.frames[0].user || cs.frames[0].label !== cs.site ||
      cs.frames.some((f) => /\?\?|c10::|at::/.test(f.label)) || !(cs.hidden > 0))
    fail(`/block's stack is not the user frame then the filtered frames: ${JSON.stringify(cs)}`);
  const gap = (await get(url, `/gap?pid=${p.pid}`)).gap;
  const sum = gap.causes.reduce((a, c) => a + c.bytes, 0);
  if (gap.reserved_bytes !== map.reserved || gap.gap_bytes !== gap.reserved_bytes - gap.allocated_bytes ||
      sum !== gap.gap_bytes || !(gap.gap_bytes > 0))
    fail(`/gap's causes do not add up to reserved - allocated: ${JSON.stringify(gap)}`);
  if (gap.pins.some((x) => x.bytes > 0 && !SITE_RE.test(x.site || '')))
    fail(`/gap's pinning stacks are not named by their user frame: ${JSON.stringify(gap.pins)}`);
  console.log(`ok: /gap ${JSON.stringify(gap.causes)} add up to ${gap.gap_bytes}; pins ${JSON.stringify(gap.pins.map((x) => x.site))}`);
  console.log(`ok: ${map.sites.length} sites, block ${blk.addr} at ${cs.site} (${cs.hidden} frames hidden), ` +
    `timeline of ${sites.t.length} buckets`);

  const browser = await launchChromium(here);
  if (browser) {
    const page = await openProcess(browser, url, p.pid);
    try {
      await page.waitForFunction(() => /^recorded · .*202\d-\d\d-\d\d/.test(document.getElementById('status').textContent) &&
        /202\d-\d\d-\d\d/.test(document.getElementById('view-info').textContent), null, { timeout: 30000 });
    } catch (e) {
      const status = await page.textContent('#status'), info = await page.textContent('#view-info');
      await browser.close();
      fail(`header '${status}', time range '${info}': want 'recorded' and a 202x date`);
    }
    const status = await page.textContent('#status'), info = await page.textContent('#view-info');
    if (/\blive\b/.test(status)) fail(`the header says live for a file: '${status}'`);
    console.log(`ok: the page says '${status}', time range '${info}'`);

    // Colours: the canvas's pixel at each block's middle, by site.
    try {
      await page.waitForFunction(() => window.mtPage.map && window.mtPage.map.bySite &&
        document.querySelector('#legend span.site') && window.mtPage.siteChart, null, { timeout: 30000 });
    } catch (e) {
      await browser.close();
      fail(`no site colours, legend or site chart: legend '${await page.textContent('#legend').catch(() => '')}'`);
    }
    const seen = await page.evaluate(() => {
      const m = window.mtPage.map, L = m.layout, g = document.getElementById('map').getContext('2d');
      return L.blocks.filter((b) => !b.freed).map((b) => {
        const x = (b.lin + b.size / 2) / L.per, row = Math.floor(x / L.W);
        const px = g.getImageData(Math.floor(x - row * L.W), Math.floor(row * L.rowH + L.rowH / 2), 1, 1).data;
        return { site: b.site, rgb: [px[0], px[1], px[2]].join(',') };
      });
    });
    const colourOf = new Map();
    for (const { site, rgb } of seen) {
      if (colourOf.has(site) && colourOf.get(site) !== rgb) fail(`site ${site} drawn in two colours`);
      colourOf.set(site, rgb);
    }
    const rgbs = [...colourOf.values()];
    if (colourOf.size < 2 || new Set(rgbs).size !== rgbs.length)
      fail(`distinct sites share a colour or there is one site only: ${JSON.stringify([...colourOf])}`);
    const legend = await page.$$eval('#legend span.site', (xs) => xs.map((x) => x.textContent));
    if (!legend.some((t) => SITE_RE.test(t)))
      fail(`the legend names no user frame 'file.py:LINE func': ${JSON.stringify(legend)}`);
    const series = await page.evaluate(() => window.mtPage.siteChart.series.slice(1).map((x) => x.label));
    if (!series.includes('transformer.py:54 forward') || !(await page.isVisible('#sitechart')))
      fail(`the site timeline is missing or lacks the top site: ${JSON.stringify(series)}`);
    console.log(`ok: ${colourOf.size} sites in ${colourOf.size} colours; legend ${JSON.stringify(legend)}; ` +
      `site timeline series ${JSON.stringify(series)}`);

    // The gap at the map's moment, with the same figures as /gap.
    try {
      await page.waitForFunction((want) => document.getElementById('gap').dataset.gap === String(want), gap.gap_bytes, { timeout: 30000 });
    } catch (e) {
      fail(`the page shows no gap of ${gap.gap_bytes}: '${await page.textContent('#gap')}'`);
    }
    const gapText = await page.textContent('#gap');
    if (!/^reserved − allocated = /.test(gapText)) fail(`gap text '${gapText}'`);
    console.log(`ok: the page says '${gapText}'`);

    // Hover and click on the first block: its user frame, then its filtered stack.
    const at = await page.evaluate(() => {
      const m = window.mtPage.map, L = m.layout, b = L.blocks[0];
      const x = (b.lin + b.size / 2) / L.per, row = Math.floor(x / L.W);
      return { x: x - row * L.W, y: row * L.rowH + L.rowH / 2, site: b.site };
    });
    await page.hover('#map', { position: { x: at.x, y: at.y } });
    const hover = await page.textContent('#maphover');
    if (!hover.startsWith(at.site) || !SITE_RE.test(at.site))
      fail(`hover says '${hover}', want the block's site '${at.site}'`);
    await page.click('#map', { position: { x: at.x, y: at.y } });
    await page.waitForSelector('#blockinfo .callstack li', { timeout: 30000 });
    const click = await page.textContent('#blockinfo');
    const frames = await page.$$eval('#blockinfo .callstack li', (xs) => xs.map((x) => x.textContent));
    if (!click.includes('site ' + at.site) || frames[0] !== at.site || frames.some((f) => /\?\?|c10::/.test(f)) ||
        !/frame\(s\) hidden/.test(click))
      fail(`click says '${click}'`);
    console.log(`ok: hover '${hover}'; click shows ${JSON.stringify(frames)}`);

    // The compare view of two ranges (A: the first half, B: all of it): its call-site rows
    // named by the snapshot's frames, one row per name shown (three stacks differ only in
    // the C++ frames the page hides: one row for them).
    await page.evaluate(async ({ pid, from, to }) => {
      S.cmp.a = { pid, from, to: from + (to - from) / 2 };
      S.cmp.b = { pid, from, to };
      await renderCompare();
    }, { pid: p.pid, from: Number(h.from), to: Number(h.to) }).catch((e) => fail('the compare view failed: ' + e));
    await page.waitForFunction(() => document.querySelectorAll('#compare-sites tbody tr').length > 0, null, { timeout: 30000 })
      .catch(() => fail('the compare view lists no call site'));
    const rows = await page.$$eval('#compare-sites tbody tr', (trs) => trs.map((t) => t.cells[0].textContent));
    const fwd = rows.filter((r) => r === 'transformer.py:54 forward  ← train.py:30 train_step');
    if (fwd.length !== 1 || rows.some((r) => /unknown/.test(r)) || new Set(rows).size !== rows.length)
      fail(`the compare view's call-site rows: ${JSON.stringify(rows)}`);
    await browser.close();
    console.log(`ok: the compare view's call sites ${JSON.stringify(rows)}`);
  }
  view.kill('SIGINT');
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
