/* memtrace web page: polls the daemon (or `memtrace view`) once a second and draws
 * the process list, the selected process's charts (uPlot), its segment map, the event
 * tail, alerts and the comparison of two time ranges. Every request goes to the page's
 * own origin. The token comes in the URL's fragment (#token=..., which the browser never
 * sends), is kept in sessionStorage (per scheme, host and port: a server on another port
 * of localhost cannot read it, as it could a cookie) and leaves the address bar at once;
 * each request carries it as "Authorization: Bearer". */
'use strict';

const REFRESH_MS = 1000;
const TOKEN_KEY = 'memtrace_token';
const TOKEN = (() => {
  const frag = new URLSearchParams(location.hash.slice(1));
  const query = new URLSearchParams(location.search);
  // An older link gave the token in the query: taken the same way, then scrubbed too.
  const tok = frag.get('token') || query.get('token');
  if (tok) {
    try { sessionStorage.setItem(TOKEN_KEY, tok); } catch (e) { /* storage off: this load only */ }
    frag.delete('token');
    query.delete('token');
    const q = query.toString(), f = frag.toString();
    history.replaceState(history.state, '', location.pathname + (q ? '?' + q : '') + (f ? '#' + f : ''));
    return tok;
  }
  try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
})();
const $ = (id) => document.getElementById(id);

const S = {
  pid: null,            // selected process
  view: { live: true, span: 300, from: 0, to: 0 },
  mapSeq: null,         // null = live segment map, else the event seq shown
  map: null,            // last /map answer (with parsed layout)
  state: null,          // last /state answer
  tagKey: '',           // tags of the current chart (it is rebuilt when they change)
  chart: null, hostChart: null,
  eventNs: 0,           // the selected process has no clock: its times count events, this far apart
  sparks: new Map(),    // pid -> uPlot
  cmp: { a: null, b: null },
  sites: null,          // /sites of the selected process; false: it has none
  analysis: null,       // last /analysis of the selected process (scopes, temporaries, settings)
  runs: undefined,      // /diff (memtrace view BEFORE AFTER); null: there is none
  jobs: undefined,      // /jobs (memtrace view of ranks' logs); null: there is none
  settingMarks: 0,      // settings changes drawn on the chart at its last draw
  perf: [],             // ms per page update (Performance API), for the benchmark and test
  updates: 0,
  busy: false,
  unauthorized: false,  // the last request was refused for its token (401)
};
window.mtPage = S;

function api(path) {
  const headers = TOKEN ? { Authorization: 'Bearer ' + TOKEN } : {};
  return fetch(path, { cache: 'no-store', credentials: 'omit', headers }).then((r) => {
    S.unauthorized = r.status === 401;
    if (!r.ok) throw new Error(path + ': HTTP ' + r.status);
    return r.json();
  });
}

function fmtBytes(b) {
  if (b == null) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0, v = b;
  while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(v < 10 ? 2 : 1) : String(v)) + ' ' + u[i];
}
const fmtPct = (x) => (x == null ? '–' : (100 * x).toFixed(1) + ' %');
// The event a time of the selected process stands for when its recording has no clock (a
// snapshot whose trace has no times: /state's event_ns, the events' spacing on the axis).
const evAt = (s) => Math.round(s * 1e9 / S.eventNs);
const fmtTime = (s) => (S.eventNs ? 'event ' + evAt(s)
  : new Date(s * 1000).toLocaleTimeString([], { hour12: false }) +
    '.' + String(Math.floor((s % 1) * 1000)).padStart(3, '0'));
// The day of epoch seconds s, as YYYY-MM-DD in local time.
const fmtDay = (s) => {
  const d = new Date(s * 1000);
  return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}-${String(d.getDate()).padStart(2, '0')}`;
};
// A time with its day in front when it is not today (recorded files: a snapshot's clock is
// the run's, days or months ago).
const fmtWhen = (s) => (S.eventNs || fmtDay(s) === fmtDay(Date.now() / 1000) ? '' : fmtDay(s) + ' ') + fmtTime(s);
// A duration in seconds: in events without a clock.
const fmtSpan = (s, digits) => (S.eventNs ? evAt(s) + ' events' : s.toFixed(digits) + ' s');
// The x axis of a chart over time: dates and times, or event numbers.
const timeAxis = () => (S.eventNs ? { values: (u, vals) => vals.map((v) => String(evAt(v))) } : {});

const PALETTE = ['#1976d2', '#e53935', '#43a047', '#fb8c00', '#8e24aa', '#00acc1', '#6d4c41',
  '#c0ca33', '#d81b60', '#3949ab', '#00897b', '#f4511e', '#5e35b1', '#7cb342', '#546e7a'];
const tagColours = new Map();
function tagColour(name) {
  if (!tagColours.has(name)) tagColours.set(name, PALETTE[tagColours.size % PALETTE.length]);
  return tagColours.get(name);
}

// Sites (a snapshot's blocks have no tags): one colour per site name, "other" grey.
const siteColours = new Map();
function siteColour(name) {
  if (name === 'other') return '#90a4ae';
  if (!siteColours.has(name)) siteColours.set(name, PALETTE[siteColours.size % PALETTE.length]);
  return siteColours.get(name);
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text != null) e.textContent = text;
  return e;
}

/* ---- process list and sparklines ---- */

function sparkline(td, pid) {
  let u = S.sparks.get(pid);
  if (!u || !td.contains(u.root)) {
    if (u) u.destroy();
    u = new uPlot({ width: 130, height: 26, cursor: { show: false }, legend: { show: false },
      select: { show: false }, axes: [{ show: false }, { show: false }],
      scales: { x: { time: false } },
      series: [{}, { stroke: '#1976d2', fill: 'rgba(25,118,210,0.15)', width: 1 }] },
      [[], []], td);
    S.sparks.set(pid, u);
  }
  return u;
}

function renderProcs(state, spark) {
  const tbody = $('procs').tBodies[0];
  const procs = state.processes.slice().reverse(); // newest first
  const seen = new Set();
  const rows = new Map([...tbody.rows].map((r) => [Number(r.dataset.pid), r]));
  for (const p of procs) {
    if (seen.has(p.pid)) continue; // a pid registered twice: its newest registration
    seen.add(p.pid);
    let r = rows.get(p.pid);
    if (!r) {
      r = el('tr', { 'data-pid': p.pid });
      r.append(el('td'), el('td'), el('td'));
      r.addEventListener('click', () => select(p.pid));
      tbody.append(r);
    }
    rows.delete(p.pid);
    r.className = (p.pid === S.pid ? 'sel ' : '') + (p.state === 'exited' ? 'exited' : '');
    r.cells[0].textContent = `${p.name} (${p.pid})` +
      (p.snapshot ? ' · snapshot' : p.state === 'exited' ? ' · ' + (p.exit_reason || 'exited') : '');
    r.cells[1].textContent = fmtBytes(p.allocated_bytes);
    const sp = spark.get(p.pid);
    if (sp) {
      const u = sparkline(r.cells[2], p.pid);
      u.setData([sp.v.map((_, i) => i), sp.v]);
    }
  }
  for (const [pid, r] of rows) { r.remove(); const u = S.sparks.get(pid); if (u) u.destroy(); S.sparks.delete(pid); }
  if (S.pid == null && procs.length) select(procs[0].pid);
}

function select(pid) {
  if (S.pid === pid) return;
  S.pid = pid;
  S.mapSeq = null;
  S.view = { live: true, span: S.view.span || 300, from: 0, to: 0 };
  S.tagKey = '';
  if (S.chart) { S.chart.destroy(); S.chart = null; }
  if (S.siteChart) { S.siteChart.destroy(); S.siteChart = null; }
  S.sites = null;
  S.analysis = null;
  $('sites-box').hidden = true;
  $('blockinfo').textContent = 'Click a block for its size, requested bytes, tag, stream and age.';
  for (const r of $('procs').tBodies[0].rows) r.classList.toggle('sel', Number(r.dataset.pid) === pid);
  refresh();
}

/* ---- alerts ---- */

function renderAlerts(state, spark) {
  const box = $('alerts');
  box.textContent = '';
  for (const p of state.processes) {
    if (p.ooms > 0 || p.exit_reason === 'oom') {
      const lo = p.last_oom || {};
      box.append(el('div', { class: 'oom' }, `OOM: ${p.name} (${p.pid}) ${p.ooms} out-of-memory ` +
        `error(s)` + (lo.requested_bytes != null ? `, last asked for ${fmtBytes(lo.requested_bytes)} ` +
        `with ${fmtBytes(lo.free_bytes)} free` : '') + (p.exit_reason === 'oom' ? '; it exited on OOM' : '')));
    }
  }
  for (const [pid, sp] of spark) {
    const v = sp.v.filter((x) => x != null);
    if (v.length < 8 || sp.exited) continue;
    const q = 4, n = Math.floor(v.length / q), mins = [];
    for (let i = 0; i < q; i++) mins.push(Math.min(...v.slice(i * n, (i + 1) * n)));
    const rising = mins.every((m, i) => i === 0 || m > mins[i - 1]);
    const grew = mins[q - 1] - mins[0];
    if (rising && grew > Math.max(1 << 20, 0.05 * mins[0])) {
      const p = state.processes.find((x) => x.pid === pid);
      box.append(el('div', { class: 'growth' }, `Growth: ${p ? p.name : ''} (${pid}) allocated ` +
        `keeps rising: its floor grew by ${fmtBytes(grew)} over the last 2 minutes`));
    }
  }
}

/* ---- charts ---- */

function viewRange(h) {
  if (S.view.live) {
    const now = h ? h.now : Date.now() / 1000;
    return S.view.span ? { from: now - S.view.span, to: now } : { from: null, to: null };
  }
  return { from: S.view.from, to: S.view.to };
}

// The start of the live view of p: the last span seconds before now while it runs, before
// its last event once it has exited (a recording's may be days old: no window of the
// wall clock holds it); the whole run until that last event is known.
function liveFrom(p) {
  if (!S.view.span) return '';
  if (p.state !== 'exited') return `&from=${Date.now() / 1000 - S.view.span - 5}`;
  const h = S.lastHistory && S.lastHistory.pid === S.pid ? S.lastHistory : null;
  return h ? `&from=${Number(h.now) - S.view.span}` : '';
}

function chartWidth(id) { return Math.max(300, $(id).clientWidth - 2); }

function buildChart(tags) {
  if (S.chart) S.chart.destroy();
  const series = [{ value: (u, v) => (v == null ? '–' : fmtTime(v)) }];
  // Stacked by tag: cumulative sums drawn from the largest down, each filled to zero.
  for (let k = tags.length - 1; k >= 0; k--) {
    const c = tagColour(tags[k]);
    series.push({ label: tags[k], stroke: c, fill: c + '55', width: 1,
      value: (u, v, si, i) => fmtBytes(S.raw && S.raw[tags[k]] ? S.raw[tags[k]][i] : null) });
  }
  series.push({ label: 'allocated (max)', stroke: '#000', width: 1.5, value: (u, v) => fmtBytes(v) });
  series.push({ label: 'allocated (min)', stroke: '#888', width: 1, dash: [4, 3], value: (u, v) => fmtBytes(v) });
  series.push({ label: 'reserved', stroke: '#b71c1c', width: 1.5, value: (u, v) => fmtBytes(v) });
  series.push({ label: 'peak', stroke: '#ff6f00', width: 1, dash: [6, 4], value: (u, v) => fmtBytes(v) });
  S.chart = new uPlot({
    width: chartWidth('chart'), height: 280, series,
    scales: { x: { time: !S.eventNs } },
    axes: [timeAxis(), { values: (u, vals) => vals.map(fmtBytes), size: 80 }],
    cursor: { drag: { x: true, y: false } },
    hooks: { draw: [drawSettingMarks], setSelect: [(u) => {
      if (u.select.width < 3) return;
      const from = u.posToVal(u.select.left, 'x'), to = u.posToVal(u.select.left + u.select.width, 'x');
      u.setSelect({ left: 0, width: 0 }, false);
      S.view = { live: false, span: S.view.span, from, to };
      refresh();
    }] },
  }, [[]].concat(series.slice(1).map(() => [])), $('chart'));
  S.chart.over.addEventListener('dblclick', () => { S.view.live = true; refresh(); });
  let down = null;
  S.chart.over.addEventListener('mousedown', (e) => { down = e.clientX; });
  S.chart.over.addEventListener('click', (e) => {
    if (down == null || Math.abs(e.clientX - down) > 2) return;
    const t = S.chart.posToVal(S.chart.cursor.left, 'x');
    mapAtTime(t);
  });
}

function renderHistory(h) {
  const tags = Object.keys(h.tags);
  const key = tags.join('\u0000');
  if (!S.chart || key !== S.tagKey) { S.tagKey = key; buildChart(tags); }
  S.raw = h.tags;
  const cum = [];
  let acc = h.t.map(() => 0);
  for (const k of tags) {
    acc = acc.map((a, i) => a + (h.tags[k][i] || 0));
    cum.push(acc.map((a, i) => (h.tags[k][i] == null && h.amax[i] == null ? null : a)));
  }
  const data = [h.t].concat(cum.reverse(), [h.amax, h.amin, h.reserved, h.peak]);
  S.chart.setData(data);
  if (!S.hostChart) {
    S.hostChart = new uPlot({ width: chartWidth('hostchart'), height: 130,
      scales: { x: { time: !S.eventNs } }, axes: [timeAxis(), { values: (u, vals) => vals.map(fmtBytes), size: 80 }],
      series: [{}, { label: 'host allocated', stroke: '#00897b', fill: '#00897b33', value: (u, v) => fmtBytes(v) },
        { label: 'host reserved', stroke: '#4e342e', value: (u, v) => fmtBytes(v) }] },
    [[], [], []], $('hostchart'));
  }
  S.hostChart.setData([h.t, h.host_allocated, h.host_reserved]);
  $('view-info').textContent = (S.view.live ? (S.recorded ? 'to the end, ' : 'live, ') : 'fixed, ') + fmtWhen(h.from) + ' – ' +
    (S.eventNs || fmtDay(h.from) === fmtDay(h.to) ? fmtTime(h.to) : fmtWhen(h.to)) +
    (S.eventNs ? ' (the file has no clock: by event)' : '');
  for (const b of document.querySelectorAll('[data-span]'))
    b.classList.toggle('on', S.view.live && Number(b.dataset.span) === S.view.span);
  $('go-live').classList.toggle('on', S.view.live);
}

/* Settings changed at run time (/analysis): a dashed line at each change inside the x
 * range, with its key. */
function drawSettingMarks(u) {
  const a = S.analysis;
  let n = 0;
  if (a && a.pid === S.pid) {
    const g = u.ctx, { left, top, width, height } = u.bbox;
    const lo = u.scales.x.min, hi = u.scales.x.max;
    g.save();
    g.strokeStyle = '#6a1b9a'; g.fillStyle = '#6a1b9a'; g.lineWidth = 1;
    g.setLineDash([3, 3]);
    g.font = `${10 * devicePixelRatio}px sans-serif`;
    for (const c of a.settings_changes) {
      if (!(c.at >= lo && c.at <= hi)) continue;
      const x = Math.round(u.valToPos(c.at, 'x', true));
      g.beginPath(); g.moveTo(x, top); g.lineTo(x, top + height); g.stroke();
      g.fillText(c.key, Math.min(x + 3, left + width - 60), top + 12 * devicePixelRatio * (1 + (n % 3)));
      n++;
    }
    g.restore();
  }
  S.settingMarks = n;
}

/* ---- segment map ---- */

function layoutMap(m) {
  const ranges = m.ranges.map((r) => ({ addr: BigInt(r[0]), size: r[1], mapped: r[2], pool: r[3], stream: r[4] }))
    .sort((a, b) => (a.addr < b.addr ? -1 : a.addr > b.addr ? 1 : 0));
  let lin = 0;
  for (const r of ranges) { r.lin = lin; lin += r.size; }
  const blocks = m.blocks.map((b) => ({ hex: b[0], addr: BigInt(b[0]), size: b[1], tag: b[2], freed: b[3],
    site: b.length > 4 && b[4] >= 0 && m.sites ? m.sites[b[4]] : null }))
    .sort((a, b) => (a.addr < b.addr ? -1 : a.addr > b.addr ? 1 : 0));
  let k = 0;
  for (const b of blocks) {
    while (k < ranges.length && ranges[k].addr + BigInt(ranges[k].size) <= b.addr) k++;
    b.lin = k < ranges.length && ranges[k].addr <= b.addr ? ranges[k].lin + Number(b.addr - ranges[k].addr) : -1;
  }
  m.layout = { ranges, blocks: blocks.filter((b) => b.lin >= 0), total: lin };
  // Without tags (a snapshot, or a process that tagged nothing) the blocks are coloured
  // by their site: tags would all read "other".
  m.bySite = !!m.sites && Object.values(m.tag_names).every((n) => n === 'other');
}

function drawMap(m) {
  const cv = $('map');
  const W = cv.clientWidth || 900, H = 220;
  if (cv.width !== W) cv.width = W;
  const g = cv.getContext('2d');
  g.fillStyle = '#fff';
  g.fillRect(0, 0, W, H);
  const L = m.layout, rows = 10, rowH = H / rows;
  const per = Math.max(1, L.total / (W * rows)); // bytes per pixel
  m.layout.per = per; m.layout.rowH = rowH; m.layout.W = W;
  const span = (lin, size, colour) => {
    let x = lin / per, w = Math.max(size / per, 1);
    g.fillStyle = colour;
    while (w > 0) {
      const row = Math.floor(x / W), cx = x - row * W, cw = Math.min(w, W - cx);
      g.fillRect(cx, row * rowH + 1, cw, rowH - 2);
      x += cw; w -= cw;
    }
  };
  for (const r of L.ranges) span(r.lin, r.size, r.mapped ? '#e0f2f1' : '#eceff1');
  for (const b of L.blocks) {
    const name = m.tag_names[b.tag] || 'tag' + b.tag;
    span(b.lin, b.size, b.freed ? '#bdbdbd' : m.bySite ? siteColour(b.site || 'other') : tagColour(name));
  }
  g.fillStyle = '#263238';
  for (const r of L.ranges) { const x = r.lin / per, row = Math.floor(x / W); g.fillRect(x - row * W, row * rowH, 1, rowH); }
  const lg = $('legend');
  lg.textContent = '';
  if (m.bySite) {
    const shown = new Set(L.blocks.map((b) => b.site || 'other'));
    for (const n of m.sites.filter((x) => shown.has(x))) {
      const s = el('span', { class: 'site', 'data-site': n, title: n }); const i = el('i'); i.style.background = siteColour(n);
      s.append(i, n); lg.append(s);
    }
  } else {
    for (const t in m.tag_names) {
      const s = el('span'); const i = el('i'); i.style.background = tagColour(m.tag_names[t]);
      s.append(i, m.tag_names[t]); lg.append(s);
    }
  }
  const s = el('span'); const i = el('i'); i.style.background = '#bdbdbd'; s.append(i, 'freed, awaiting its stream'); lg.append(s);
  const f = el('span'); const j = el('i'); j.style.background = '#eceff1'; f.append(j, 'free in a segment'); lg.append(f);
}

function renderMap(m) {
  layoutMap(m);
  S.map = m;
  drawMap(m);
  $('map-blocks').textContent = String(m.nblocks);
  $('map-frag').textContent = `reserved ${fmtBytes(m.reserved)}, free ${fmtBytes(m.total_free)}, ` +
    `largest free ${fmtBytes(m.largest_free)}, fragmentation ${fmtPct(m.fragmentation)}` +
    (m.blocks_truncated ? ' (blocks truncated)' : '');
  const w = m.window, sc = $('scrub');
  if (w) {
    sc.min = w.first_seq; sc.max = w.last_seq;
    sc.value = S.mapSeq == null ? w.last_seq : m.seq;
    $('scrub-info').textContent = (m.live ? 'live' : `at event ${m.seq}, ${fmtTime(m.t)}`) +
      ` · history of the last ${w.count} events, from ${fmtTime(w.first_t)}`;
  }
  $('map-info').textContent = m.live ? '(live)' : `(at ${fmtTime(m.t)})`;
  loadGap(m);
  $('map-live').classList.toggle('on', m.live);
}

/* Why reserved exceeds allocated at the map's moment: the causes (analysis/gap.h) that add
 * up to the gap, and the sites whose blocks pin the most free memory. */
async function loadGap(m) {
  let d;
  try { d = await api(`/gap?pid=${S.pid}` + (m.live ? '' : '&seq=' + m.seq)); } catch (e) { return; }
  if (S.map !== m) return;
  const g = d.gap, box = $('gap');
  box.textContent = '';
  box.append(el('b', null, `reserved − allocated = ${fmtBytes(g.gap_bytes)}`),
    ': ' + g.causes.filter((c) => c.bytes !== 0).map((c) => `${c.cause.replace(/_/g, ' ')} ${fmtBytes(c.bytes)}`).join(', '));
  const pins = (g.pins || []).filter((x) => x.bytes > 0);
  if (pins.length)
    box.append(el('div', { class: 'muted' }, 'free memory pinned by live blocks of: ' +
      pins.map((x) => `${x.site || 'stack ' + x.stack} ${fmtBytes(x.bytes)}`).join(', ')));
  box.dataset.gap = String(g.gap_bytes);
}

function mapQuery() {
  return S.mapSeq == null ? '' : '&seq=' + S.mapSeq;
}

async function mapAtTime(t) {
  const m = await api(`/map?pid=${S.pid}&t=${t}`);
  S.mapSeq = m.seq;
  renderMap(m);
}

async function mapAtSeq(seq) {
  S.mapSeq = seq;
  renderMap(await api(`/map?pid=${S.pid}&seq=${seq}`));
}

// The block under the mouse event ev, or null.
function blockUnder(ev) {
  const m = S.map;
  if (!m || !m.layout.per) return null;
  const r = $('map').getBoundingClientRect();
  const x = ev.clientX - r.left, y = ev.clientY - r.top;
  const row = Math.floor(y / m.layout.rowH);
  const lin = (row * m.layout.W + x) * m.layout.per;
  const slop = 2 * m.layout.per;
  return m.layout.blocks.find((bb) => lin >= bb.lin - slop && lin < bb.lin + bb.size + slop) || null;
}

function hoverMap(ev) {
  const b = blockUnder(ev), h = $('maphover');
  const text = !b ? '' : `${b.site ? b.site + ' · ' : ''}${fmtBytes(b.size)} at ${b.hex}` +
    (b.freed ? ' (freed, awaiting its stream)' : '') + ' · click for its stack';
  h.textContent = text;
  $('map').title = text;
}

async function blockAt(ev) {
  const m = S.map;
  const b = blockUnder(ev);
  if (!m || !m.layout.per) return;
  const box = $('blockinfo');
  if (!b) { box.textContent = 'No block there (free space).'; return; }
  const info = await api(`/block?pid=${S.pid}&addr=${b.hex}${mapQuery()}`).catch(() => null);
  if (!info || info.live === false) { /* freed since the map was drawn */
    box.textContent = `block ${b.hex}: ` + (info ? `freed at ${fmtTime(info.freed_t)} (event ${info.freed_seq}), after this map was drawn`
      : 'no longer known to the server');
    return;
  }
  const name = m.tag_names[b.tag] || 'tag' + b.tag;
  const cs = info.call_stack;
  box.textContent = `block ${b.hex}: size ${fmtBytes(b.size)}` +
    (cs && cs.site ? `, site ${cs.site}` : '') + `, tag ${name}` + (b.freed ? ' (freed, awaiting its stream)' : '') +
    (info.before_window ? '; allocated before the kept history (requested bytes, stream and age unknown)'
      : `, requested ${fmtBytes(info.requested)}, stream ${info.stream}, pool ${info.pool}, ` +
        (info.before_trace ? 'allocated before the snapshot\'s trace began (its time unknown)'
          : `age ${fmtSpan(info.age_s, 3)} (allocated at ${fmtTime(info.allocated_t)}, event ${info.seq})`));
  box.append(stackList(info.call_stack));
}

/* A block's call stack, innermost frame first (text nodes only: labels come from programs). */
function stackList(cs) {
  const d = el('div', { class: 'callstack' });
  if (!cs) { d.textContent = 'No call stack recorded (MEMTRACE_STACKS=all records one per allocation).'; return d; }
  if (!(cs.frames || []).length && !cs.unknown) { /* a stack without frames: say why where known */
    d.textContent = (cs.site || '').startsWith('before the trace')
      ? 'No call stack: allocated before the snapshot\'s trace began, and the snapshot holds no frames for it ' +
        '(start torch.cuda.memory._record_memory_history before building the model to record them).'
      : 'No call stack recorded.';
    return d;
  }
  d.append(el('div', { class: 'muted' }, `call stack ${cs.stack}` + (cs.unknown ? ' (not in the stack table)' : '') +
    (cs.site ? ` · user frame ${cs.site}; from it outwards, ${cs.hidden} framework, interpreter and allocator frame(s) hidden` : '')));
  const ol = el('ol');
  for (const f of cs.frames || []) ol.append(el('li', { title: f.module || f.file || '', class: f.user ? 'user' : '' }, f.label));
  if (cs.truncated) ol.append(el('li', { class: 'muted' }, '…'));
  d.append(ol);
  return d;
}

/* ---- live bytes by site (snapshots) ---- */

// The snapshot's timeline by site, computed by the daemon at load: stacked, largest site
// at the bottom. Fetched once per process (a recording does not change).
async function loadSites(pid) {
  let d;
  try { d = await api(`/sites?pid=${pid}`); } catch (e) { return; } // not a snapshot
  if (S.pid !== pid) return;
  S.sites = d;
  const box = $('sites-box');
  box.hidden = false;
  if (S.siteChart) S.siteChart.destroy();
  const names = d.sites.map((s) => s.name);
  const keep = names.map((n, k) => k).filter((k) => d.sites[k].peak > 0);
  const series = [{ value: (u, v) => (v == null ? '–' : d.by_time ? fmtWhen(v) : 'event ' + (v + 1)) }];
  const cum = [];
  let acc = d.t.map(() => 0);
  for (const k of keep) {
    acc = acc.map((a, i) => a + d.bytes[k][i]);
    cum.push(acc);
  }
  // Drawn from the top of the stack down, each filled to zero.
  for (let j = keep.length - 1; j >= 0; j--) {
    const k = keep[j], c = siteColour(names[k]);
    series.push({ label: names[k], stroke: c, fill: c + '88', width: 1,
      value: (u, v, si, i) => fmtBytes(d.bytes[k][i]) });
  }
  S.siteChart = new uPlot({ width: chartWidth('sitechart'), height: 240, series,
    scales: { x: { time: d.by_time } }, axes: [{}, { values: (u, vals) => vals.map(fmtBytes), size: 80 }] },
  [d.t].concat(cum.reverse()), $('sitechart'));
}

/* ---- scopes, temporary allocations, settings changed (/analysis) ---- */

// A setting's value as the config string writes it (as `memtrace report` prints it).
function settingValue(key, v) {
  if (v >= 9.2e18) return 'unlimited';
  if (/_mb/.test(key)) return String(Math.round(v / 1048576)) + ' MiB';
  if (/threshold|fraction/.test(key)) return String(v / 1e6);
  return String(v);
}
const fmtUs = (us) => (us >= 1000 ? (us / 1000).toFixed(us >= 10000 ? 1 : 2) + ' ms' : us + ' µs');

// One table body from rows of [text, attributes] cells; a muted line when there are none.
function fillRows(table, rows, none) {
  const tb = table.tBodies[0];
  tb.textContent = '';
  if (!rows.length) {
    const r = el('tr');
    r.append(el('td', { class: 'muted', colspan: table.tHead.rows[0].cells.length }, none));
    tb.append(r);
  }
  for (const cells of rows) {
    const r = el('tr');
    for (const [text, attrs] of cells) r.append(el('td', attrs, text));
    tb.append(r);
  }
}

// What `memtrace report` says of the process in "scopes", "temporary" and
// "settings_changes": the daemon answers from the same analysis code.
async function loadAnalysis(pid) {
  let a;
  try { a = await api(`/analysis?pid=${pid}`); } catch (e) { return; }
  if (S.pid !== pid) return;
  S.analysis = a;
  fillRows($('scopes'), a.scopes.map((x) => [[x.name, { class: 'key' }],
    [String(x.count), { 'data-n': x.count }], [fmtBytes(x.peak_bytes), { 'data-bytes': x.peak_bytes }],
    [fmtBytes(x.mean_peak_bytes), { 'data-bytes': x.mean_peak_bytes }],
    [S.eventNs ? fmtSpan(x.mean_seconds) : (x.mean_seconds * 1000).toFixed(3) + ' ms', { 'data-s': x.mean_seconds }]]),
  'none closed yet');
  $('temp-info').textContent = S.eventNs ? '(none told: the file has no clock, so no lifetimes)'
    : `(blocks freed within ${fmtUs(a.temporary_window_us)} of their allocation, by ${a.temporary_by}, the most first)`;
  fillRows($('temporary'), a.temporary.map((x) => [[x.site, { class: 'site' }],
    [String(x.count), { 'data-n': x.count }], [fmtBytes(x.bytes), { 'data-bytes': x.bytes }],
    [fmtUs(x.median_lifetime_us), { 'data-us': x.median_lifetime_us }]]), S.eventNs ? 'no clock' : 'none yet');
  fillRows($('settings'), a.settings_changes.map((x) => [[fmtWhen(x.at), { 'data-at': x.at }],
    [fmtSpan(x.t, 3), { 'data-t': x.t }], [String(x.device)], [x.key, { class: 'key' }],
    [settingValue(x.key, x.before), { 'data-v': x.before }], [settingValue(x.key, x.value), { 'data-v': x.value }]]), 'none');
  if (S.chart) S.chart.redraw(false);
}

/* ---- two runs compared (/diff, `memtrace view BEFORE AFTER`) ---- */

async function loadRuns() {
  let d;
  try { d = await api('/diff'); } catch (e) { S.runs = null; return; }
  S.runs = d;
  const f = d.diff;
  $('runs').hidden = false;
  $('runs-names').textContent = `${d.before} → ${d.after}`;
  const delta = (v) => (v > 0 ? '+' : v < 0 ? '−' : '') + fmtBytes(Math.abs(v));
  const figs = [['peak allocated', 'peak_allocated'], ['peak reserved', 'peak_reserved'],
    ['final allocated', 'final_allocated'], ['final reserved', 'final_reserved']];
  fillRows($('runs-figures'), figs.map(([name, k]) => {
    const x = f[k];
    return [[name, { 'data-key': k }], [fmtBytes(x.before), { 'data-bytes': x.before }],
      [fmtBytes(x.after), { 'data-bytes': x.after }],
      [delta(x.delta), { 'data-bytes': x.delta, class: x.delta > 0 ? 'grew' : x.delta < 0 ? 'shrank' : '' }],
      [x.growth_pct == null ? '–' : (x.growth_pct >= 0 ? '+' : '') + x.growth_pct.toFixed(1) + ' %']];
  }), '');
  const lists = $('runs-lists');
  lists.textContent = '';
  for (const [title, k] of [['new sites', 'new'], ['grew', 'grew'], ['gone', 'gone'],
    ['freed now, never freed before', 'freed_now'], ['never freed now, freed before', 'never_freed_now']]) {
    if (!(f[k] || []).length) continue;
    const div = el('div', { 'data-list': k });
    div.append(el('b', null, title + ': '), f[k].join('; '));
    lists.append(div);
  }
  fillRows($('runs-sites'), f.sites.filter((x) => x.status !== 'same').map((x) => [
    [x.status, { class: x.status === 'new' || x.status === 'grew' ? 'new' : x.status === 'gone' ? 'gone' : '' }],
    [x.key, { class: 'site' }], [fmtBytes(x.before), { 'data-bytes': x.before }],
    [fmtBytes(x.after), { 'data-bytes': x.after }], [delta(x.delta), { 'data-bytes': x.delta }],
    [fmtBytes(x.never_freed_before) + ' → ' + fmtBytes(x.never_freed_after)]]), 'no site changed');
}

/* ---- the ranks of a job (/jobs, `memtrace view` of ranks' logs) ---- */

// A table with a head of names and a body from rows of [text, attributes] cells.
function jobTable(cls, head, rows) {
  const t = el('table', { class: cls });
  const hr = el('tr');
  for (const h of head) hr.append(el('th', null, h));
  t.append(el('thead'), el('tbody'));
  t.tHead.append(hr);
  fillRows(t, rows, '');
  return t;
}

async function loadJobs() {
  let jobs;
  try { jobs = await api('/jobs'); } catch (e) { S.jobs = null; return; }
  S.jobs = jobs;
  const list = $('jobs-list');
  list.textContent = '';
  for (const g of jobs) {
    const h = g.highest;
    const div = el('div', { class: 'job', 'data-job': g.job || '' });
    const world = g.world_size ? ` of ${g.world_size}` : '';
    const missing = g.missing ? ` (${g.missing} missing: ${g.missing_ranks.join(', ')})` : '';
    const how = g.aligned_by === 'iteration' ? 'aligned by iteration marks'
      : `not aligned: rank ${g.unmarked_ranks.join(', ')} marked no iterations`;
    div.append(el('h3', null, `job ${g.job || '(no job id)'}: ${g.ranks.length} ranks${world}${missing}; ${how}`));
    const ranks = jobTable('job-ranks', ['rank', 'pid', 'peak allocated', 'peak reserved', 'peak iteration'],
      g.ranks.map((r) => [[String(r.rank), { 'data-rank': r.rank }], [String(r.pid)],
        [fmtBytes(r.peak_allocated), { 'data-bytes': r.peak_allocated }],
        [fmtBytes(r.peak_reserved), { 'data-bytes': r.peak_reserved }],
        [r.peak_iteration == null ? '–' : String(r.peak_iteration)]]));
    g.ranks.forEach((r, i) => {
      const tr = ranks.tBodies[0].rows[i];
      if (r.rank === h.rank && g.ranks.length > 1) tr.className = 'highest';
      tr.addEventListener('click', () => select(r.pid));
    });
    div.append(ranks);
    if (g.ranks.length > 1) {
      const p = el('p', { class: 'job-diff', 'data-highest': h.rank });
      p.append(`highest: rank ${h.rank}, ${fmtBytes(h.peak_allocated)}, ${fmtBytes(h.above_median_bytes)} above the median rank (rank ${h.median_rank}, ${fmtBytes(g.median_peak_allocated)})`);
      div.append(p);
      for (const [title, k, key] of [['by tag', 'above_median_by_tag', 'tag'], ['by call site', 'above_median_by_site', 'site']]) {
        if (!(h[k] || []).length) continue;
        const d = el('div', { class: 'job-diff', 'data-diff': key });
        d.append(el('b', null, title + ': '));
        h[k].forEach((x, i) => {
          if (i) d.append('; ');
          d.append(el('span', { class: key }, x[key]), ' +' + fmtBytes(x.bytes));
        });
        div.append(d);
      }
    }
    if ((g.iterations || []).length) {
      div.append(el('div', { class: 'muted' }, 'peak allocated within each iteration (the newest every rank marked):'));
      // Every rank up to 8 (as the report prints them), else the highest and the median rank.
      const cols = g.ranks.map((r, i) => i).filter((i) => g.ranks.length <= 8 ||
        g.ranks[i].rank === h.rank || g.ranks[i].rank === h.median_rank);
      div.append(jobTable('job-iterations', ['iteration', ...cols.map((i) => 'rank ' + g.ranks[i].rank)],
        g.iterations.map((e) => [[String(e.iteration)], ...cols.map((i) => [fmtBytes(e.peaks[i]),
          { 'data-bytes': e.peaks[i], class: g.ranks[i].rank === h.rank ? 'grew' : '' }])])));
    }
    list.append(div);
  }
  $('jobs').hidden = !jobs.length;
}

/* ---- event tail ---- */

const KINDS = ['alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free',
  'segment_map', 'segment_unmap', 'oom', 'reserve', 'empty_cache', 'config', 'stats', 'mark',
  'compaction', 'gap', 'tag_label'];

const esc = (v) => String(v).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));

function renderTail(t) {
  // One string, one parse: much cheaper than a thousand createElement calls a second.
  let h = '';
  for (const e of t.events) {
    if (e.kind === 'stack_ref') continue; // a block's stack: shown on a click on the block
    h += `<tr data-tag="${esc(e.tag)}" data-kind="${esc(e.kind)}" data-pool="${esc(e.pool)}">`;
    for (const v of [e.seq, fmtTime(e.t), e.kind, e.tag, e.pool, fmtBytes(e.size), fmtBytes(e.requested),
      e.addr, e.stream, fmtBytes(e.allocated)]) h += `<td>${esc(v)}</td>`;
    h += '</tr>';
  }
  $('tail').tBodies[0].innerHTML = h;
}

function updateTagFilter(names) {
  const sel = $('f-tag');
  const have = new Set([...sel.options].map((o) => o.value));
  for (const n of names) if (!have.has(n)) sel.append(el('option', { value: n }, n));
}

/* ---- tiles ---- */

// A PyTorch snapshot is a moment of a run, not a process that exited; one without a trace
// holds that moment alone, its blocks laid out in address order on the charts.
function snapshotText(p) {
  const skipped = p.skipped_entries > 0
    ? `; ${p.skipped_entries} trace entries of actions memtrace does not model were skipped`
    : '';
  return (p.snapshot === 'state'
    ? 'a PyTorch snapshot, its state only (no history: the charts lay its blocks out in address order)'
    : 'a PyTorch snapshot') + skipped;
}

function renderTiles(p) {
  $('title').textContent = `${p.name} (pid ${p.pid})` + (p.backend ? ' · ' + p.backend : '') +
    (p.snapshot ? ' · ' + snapshotText(p) : p.state === 'exited' ? ' · exited: ' + (p.exit_reason || '') : '');
  const a = $('alloc-value');
  a.textContent = fmtBytes(p.allocated_bytes);
  a.dataset.bytes = String(p.allocated_bytes);
  $('reserved-value').textContent = fmtBytes(p.reserved_bytes);
  $('peak-value').textContent = fmtBytes(p.peak_allocated_bytes);
  $('util-value').textContent = fmtPct(p.utilization);
  $('frag-value').textContent = fmtPct(p.fragmentation);
  $('lfb-value').textContent = fmtBytes(p.largest_free_block_bytes);
  $('oom-value').textContent = String(p.ooms);
  const h = p.host || {};
  $('host-alloc-value').textContent = fmtBytes(h.allocated_bytes);
  $('host-res-value').textContent = fmtBytes(h.reserved_bytes);
  $('host-peak-value').textContent = fmtBytes(h.peak_allocated_bytes);
  updateTagFilter((p.tags || []).map((t) => t.name));
  renderOutside(p);
}

/* ---- outside the allocator ---- */

// Libraries' colours: the palette without the blue of reserved and the greys of the rest.
const libColours = new Map();
function libColour(name) {
  const pal = PALETTE.slice(1);
  if (!libColours.has(name)) libColours.set(name, pal[libColours.size % pal.length]);
  return libColours.get(name);
}

// One part of a device's used bytes: a row of the table and a piece of the bar.
function outsidePart(tb, bar, used, part, label, bytes, colour, extra) {
  const r = el('tr', { 'data-part': part, 'data-bytes': String(bytes) });
  if (extra && extra.name != null) r.dataset.name = extra.name;
  const sw = el('td');
  sw.append(el('i', { class: 'swatch', style: 'background:' + colour }), label);
  r.append(sw, el('td', { class: 'num' }, fmtBytes(bytes)),
    el('td', { class: 'num muted' }, used > 0 ? fmtPct(bytes / used) : '–'),
    el('td', { class: 'muted' }, extra && extra.note ? extra.note : ''));
  tb.append(r);
  if (bytes > 0 && used > 0)
    bar.append(el('i', { style: `width:${(100 * bytes / used).toFixed(3)}%;background:${colour}`,
      title: `${label}: ${fmtBytes(bytes)}` }));
}

// /state's "outside" of the process: per device, the model's split of the used bytes
// (reserved + libraries + context [+ other processes] + not seen = used), shown as given, never
// recomputed.
function renderOutside(p) {
  const devs = p.outside || [];
  $('outside-box').hidden = devs.length === 0;
  const box = $('outside');
  box.textContent = '';
  for (const d of devs) {
    const div = el('div', { class: 'outside-dev', 'data-device': String(d.device) });
    const head = el('div', { class: 'outside-head' });
    const u = el('span', { class: 'o-used', 'data-bytes': String(d.used) }, fmtBytes(d.used));
    const t = el('span', { class: 'o-total', 'data-bytes': String(d.total) }, fmtBytes(d.total));
    head.append(el('b', null, `device ${d.device}`), ' used ', u, ' of ', t,
      el('span', { class: 'muted' }, ` (${d.total ? fmtPct(d.used / d.total) : '–'}; peak ${fmtBytes(d.peak_used)}) · outside the allocator `),
      el('span', { class: 'o-outside', 'data-bytes': String(d.outside) }, fmtBytes(d.outside)));
    const bar = el('div', { class: 'outside-bar' });
    const table = el('table', { class: 'outside-parts' });
    const tb = el('tbody');
    table.append(tb);
    // The split takes reserved as at most used: used - outside.
    outsidePart(tb, bar, d.used, 'reserved', 'reserved (memtrace\'s allocator)', d.used - d.outside, '#1976d2');
    const libs = d.libraries || [];
    const listed = libs.reduce((s, l) => s + l.bytes, 0);
    if (listed === d.libraries_total) {
      for (const l of libs)
        outsidePart(tb, bar, d.used, 'library', l.name, l.bytes, libColour(l.name),
          { name: l.name, note: `peak ${fmtBytes(l.peak)}` });
    } else { // the device's figure lags the libraries' reports: their total as the model has it
      outsidePart(tb, bar, d.used, 'libraries', 'libraries', d.libraries_total, '#fb8c00',
        { note: 'reported: ' + libs.map((l) => `${l.name} ${fmtBytes(l.bytes)}`).join(', ') });
    }
    outsidePart(tb, bar, d.used, 'context', 'context (in use before the first allocation)', d.context, '#90a4ae');
    if (d.other_processes > 0) // the driver told this process's bytes, and others hold some
      outsidePart(tb, bar, d.used, 'other_processes', 'other processes on the device', d.other_processes, '#8d6e63');
    outsidePart(tb, bar, d.used, 'not_seen', d.other_processes === null || d.other_processes === undefined
      ? 'not seen (other processes, libraries that said nothing)' : 'not seen (this process: libraries that said nothing)',
      d.not_seen, '#cfd8dc');
    const sum = el('tr', { class: 'sum', 'data-part': 'used', 'data-bytes': String(d.used) });
    sum.append(el('td', null, '= used'), el('td', { class: 'num' }, fmtBytes(d.used)),
      el('td', { class: 'num muted' }, fmtPct(d.used ? 1 : null)), el('td', { class: 'muted' }, `of ${fmtBytes(d.total)}`));
    tb.append(sum);
    div.append(head, bar, table);
    box.append(div);
  }
}

/* ---- compare ---- */

async function setRange(which) {
  const h = S.lastHistory;
  if (!h) return;
  const r = { pid: S.pid, from: h.from, to: h.to };
  S.cmp[which] = r;
  $(which + '-info').textContent = `pid ${r.pid}, ${fmtTime(r.from)} – ${fmtTime(r.to)}`;
  if (S.cmp.a && S.cmp.b) renderCompare();
}

async function renderCompare() {
  const q = (r) => api(`/history?pid=${r.pid}&from=${r.from}&to=${r.to}&buckets=1`);
  const [a, b] = await Promise.all([q(S.cmp.a), q(S.cmp.b)]);
  const rows = [];
  const names = new Set([...Object.keys(a.tags), ...Object.keys(b.tags)]);
  for (const n of names) rows.push([n, (a.tags[n] || [0])[0] || 0, (b.tags[n] || [0])[0] || 0]);
  rows.sort((x, y) => (y[2] - y[1]) - (x[2] - x[1]));
  rows.push(['allocated (max in range)', a.amax[0] || 0, b.amax[0] || 0]);
  rows.push(['reserved (max in range)', a.reserved[0] || 0, b.reserved[0] || 0]);
  fillCompare($('compare'), rows);
  await renderCompareSites();
}

function fillCompare(table, rows) {
  const tbody = table.tBodies[0];
  tbody.textContent = '';
  for (const [n, x, y] of rows) {
    const r = el('tr');
    r.append(el('td', null, n), el('td', null, fmtBytes(x)), el('td', null, fmtBytes(y)));
    const d = el('td', { class: y > x ? 'grew' : y < x ? 'shrank' : '' }, (y >= x ? '+' : '−') + fmtBytes(Math.abs(y - x)));
    r.append(d);
    tbody.append(r);
  }
}

/* Live bytes by call site at the end of A and of B, what grew first. A row is a name as
 * shown (site, then its caller): stacks that differ only below it, or only in frames not
 * shown (a snapshot's), are one row, not several that read the same. */
async function renderCompareSites() {
  const q = (r) => api(`/callsites?pid=${r.pid}&t=${r.to}`);
  const [a, b] = await Promise.all([q(S.cmp.a), q(S.cmp.b)]);
  const sites = new Map();
  const add = (list, k) => {
    for (const c of list.callsites || []) {
      const key = c.site + ((c.frames || [])[1] ? '  ← ' + c.frames[1].label : '');
      const e = sites.get(key) || { name: key, v: [0, 0] };
      e.v[k] += c.bytes;
      sites.set(key, e);
    }
  };
  add(a, 0);
  add(b, 1);
  const rows = [...sites.values()].map((e) => [e.name, e.v[0], e.v[1]]);
  rows.sort((x, y) => (y[2] - y[1]) - (x[2] - x[1]));
  fillCompare($('compare-sites'), rows);
}

/* ---- the refresh loop ---- */

function setStatus(ok, text) {
  const s = $('status');
  s.className = 'status ' + (ok ? 'ok' : 'down');
  s.textContent = text;
}

async function refresh() {
  if (S.busy) { S.again = true; return; }
  S.busy = true;
  try {
    const [state, spark] = await Promise.all([api('/state'), api('/spark?span=120&buckets=60')]);
    S.recorded = !!(state.daemon && state.daemon.recorded);
    if (S.recorded && S.runs === undefined) { S.runs = null; loadRuns(); }
    if (S.recorded && S.jobs === undefined) { S.jobs = null; loadJobs(); }
    let hist = null, map = null, tail = null;
    const p = state.processes.filter((x) => x.pid === S.pid).pop();
    // A process without a clock counts events on its axes: the charts are made again when
    // the selection passes from one kind to the other.
    if ((p && p.event_ns ? p.event_ns : 0) !== S.eventNs) {
      S.eventNs = p && p.event_ns ? p.event_ns : 0;
      if (S.chart) { S.chart.destroy(); S.chart = null; S.tagKey = null; }
      if (S.hostChart) { S.hostChart.destroy(); S.hostChart = null; }
    }
    if (p) {
      const r = viewRange(S.lastHistory && S.lastHistory.pid === S.pid ? S.lastHistory : null);
      const rq = r.from == null ? '' : `&from=${r.from}&to=${r.to}`;
      const nb = Math.min(1000, Math.max(50, Math.floor(chartWidth('chart') / 4)));
      const f = ['kind', 'tag', 'pool'].map((k) => ($('f-' + k).value ? `&${k}=${encodeURIComponent($('f-' + k).value)}` : '')).join('');
      [hist, map, tail] = await Promise.all([
        api(`/history?pid=${S.pid}&buckets=${nb}${S.view.live ? liveFrom(p) : rq}`).catch(() => null),
        S.mapSeq == null ? api(`/map?pid=${S.pid}`).catch(() => null) : Promise.resolve(null),
        api(`/tail?pid=${S.pid}&n=60${f}`).catch(() => null)]);
    }
    // Everything arrived: the page update proper, timed.
    const t0 = performance.now();
    const sec = [];
    const lap = (name) => sec.push([name, performance.now()]);
    const sp = new Map(spark.procs.map((x) => [x.pid, x]));
    S.state = state;
    renderProcs(state, sp); lap('procs');
    renderAlerts(state, sp); lap('alerts');
    $('empty').hidden = !!p;
    $('selected').hidden = !p;
    if (p) {
      renderTiles(p); lap('tiles');
      if (hist) {
        S.lastHistory = hist;
        renderHistory(hist); lap('history');
      }
      if (map) { renderMap(map); lap('map'); }
      if (S.recorded && S.sites === null) { S.sites = false; loadSites(S.pid); }
      // A recording's analysis once; a live process's every 5 s (it walks the model).
      if (!S.analysis || (!S.recorded && S.updates % 5 === 0)) {
        if (!S.analysis) S.analysis = { pid: S.pid, scopes: [], temporary: [], settings_changes: [], temporary_window_us: 0, pending: true };
        loadAnalysis(S.pid);
      }
      if (tail) { renderTail(tail); lap('tail'); }
    }
    const dt = performance.now() - t0;
    S.sections = sec.map(([n, t], i) => [n, t - (i ? sec[i - 1][1] : t0)]);
    if (dt > (S.worst ? S.worst.dt : 0)) S.worst = { dt, sections: S.sections };
    performance.measure('mt-update', { start: t0, duration: dt });
    S.perf.push(dt);
    if (S.perf.length > 1000) S.perf.shift();
    S.updates++;
    // Files loaded by `memtrace view` are a recording: say so, with the day it was made.
    if (state.daemon && state.daemon.recorded) {
      const rt = p && p.registered_realtime_ns ? p.registered_realtime_ns / 1e9 : null;
      setStatus(true, `recorded · ${state.processes.length} process(es)` +
        (S.eventNs ? ' · no clock in the file: times are event numbers' : rt ? ` · ${fmtDay(rt)} ${fmtTime(rt)}` : ''));
    } else {
      setStatus(true, `live · ${state.processes.length} process(es) · updated ${new Date().toLocaleTimeString([], { hour12: false })}`);
    }
  } catch (e) {
    if (S.unauthorized)
      setStatus(false, TOKEN ? 'the token was refused: open the address the daemon gives (…/#token=…)'
        : 'token required: open the page as http://HOST:PORT/#token=TOKEN (memtrace token)');
    else
      setStatus(false, 'disconnected, retrying… (' + e.message + ')');
  } finally {
    S.busy = false;
    if (S.again) { S.again = false; setTimeout(refresh, 0); }
  }
}

function init() {
  for (const k of KINDS) $('f-kind').append(el('option', { value: k }, k));
  for (const b of document.querySelectorAll('[data-span]'))
    b.addEventListener('click', () => { S.view = { live: true, span: Number(b.dataset.span) }; refresh(); });
  const pan = (dir) => {
    const h = S.lastHistory; if (!h) return;
    const w = h.to - h.from;
    S.view = { live: false, span: S.view.span, from: h.from + dir * w / 2, to: h.to + dir * w / 2 };
    refresh();
  };
  $('pan-left').addEventListener('click', () => pan(-1));
  $('pan-right').addEventListener('click', () => pan(1));
  $('go-live').addEventListener('click', () => { S.view.live = true; refresh(); });
  $('scrub').addEventListener('input', (e) => mapAtSeq(Number(e.target.value)));
  $('step-back').addEventListener('click', () => mapAtSeq(Math.max(Number($('scrub').min), (S.map ? S.map.seq : 0) - 1)));
  $('step-fwd').addEventListener('click', () => mapAtSeq((S.map ? S.map.seq : 0) + 1));
  $('map-live').addEventListener('click', () => { S.mapSeq = null; refresh(); });
  $('map').addEventListener('click', blockAt);
  $('map').addEventListener('mousemove', hoverMap);
  for (const k of ['kind', 'tag', 'pool']) $('f-' + k).addEventListener('change', refresh);
  $('set-a').addEventListener('click', () => setRange('a'));
  $('set-b').addEventListener('click', () => setRange('b'));
  window.addEventListener('resize', () => { S.tagKey = ''; if (S.hostChart) { S.hostChart.destroy(); S.hostChart = null; } refresh(); });
  refresh();
  setInterval(refresh, REFRESH_MS);
}

init();
