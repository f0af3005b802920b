// Checks every dashboards/*.json against Grafana's own published dashboard schema, then shows
// the check has teeth: altered copies of dashboards/memtrace.json must each be rejected with
// the expected message.
//
//   node tests/grafana/check.mjs SOURCE_ROOT [PYTHON3]
//
// The schema is @grafana/schema (the TypeScript types Grafana generates from its CUE kinds),
// narrowed in dashboard.ts to the panel plugins and the Prometheus queries the dashboard uses.
// Each dashboard becomes `const dashboard: Dashboard = <the file's JSON>;` and one
// `tsc --noEmit --strict` run checks them all; an object literal gets TypeScript's excess
// property check, so a misspelled field is an error, not an ignored extra.
//
// The CUE kinds also hold constraints that TypeScript types cannot say (the grid is 24
// columns wide, ids are unique); those, and the references between variables and queries,
// are checked here in JavaScript, with negative cases too.
//
// With PYTHON3, dashboards/gen_dashboard.py is also run into a temporary file, which must
// equal dashboards/memtrace.json: the file checked is the one the generator writes.
//
// Exit 0 = all as expected, 1 = not, 77 = node_modules missing (npm ci --prefix tests/grafana).
// MT_KEEP=1 keeps the generated .ts files and tsconfig.json (their directory is printed).
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const [root, python3] = process.argv.slice(2);
if (!root) {
  console.error('usage: check.mjs SOURCE_ROOT [PYTHON3]');
  process.exit(1);
}
const tsc = path.join(here, 'node_modules', 'typescript', 'bin', 'tsc');
for (const need of [tsc, path.join(here, 'node_modules', '@grafana', 'schema', 'package.json'),
  path.join(here, 'node_modules', '@grafana', 'grafana-foundation-sdk', 'package.json')]) {
  if (!fs.existsSync(need)) {
    console.log(`skip: ${path.relative(here, need)} missing; run npm ci --prefix tests/grafana`);
    process.exit(77);
  }
}
const version = (name) =>
  JSON.parse(fs.readFileSync(path.join(here, 'node_modules', name, 'package.json'))).version;

let failures = 0;
const fail = (msg) => { console.log(`FAIL: ${msg}`); failures++; };
const ok = (msg) => console.log(`ok: ${msg}`);

/* ---- the dashboards and their JSON ---- */

const dashDir = path.join(root, 'dashboards');
const dashboards = fs.readdirSync(dashDir).filter((f) => f.endsWith('.json')).sort();
if (!dashboards.includes('memtrace.json')) {
  fail(`no memtrace.json among ${dashDir}/*.json`);
  process.exit(1);
}
const texts = new Map();
for (const f of dashboards) {
  const text = fs.readFileSync(path.join(dashDir, f), 'utf8');
  try {
    JSON.parse(text);
    texts.set(f, text);
  } catch (e) {
    fail(`dashboards/${f} is not JSON: ${e.message}`);
  }
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mt-grafana-'));
if (process.env.MT_KEEP) console.log(`keeping ${tmp}`);
else process.on('exit', () => fs.rmSync(tmp, { recursive: true, force: true }));

if (python3) {
  const regen = path.join(tmp, 'regenerated.json');
  const r = spawnSync(python3, [path.join(dashDir, 'gen_dashboard.py'), regen],
    { encoding: 'utf8' });
  if (r.status !== 0) {
    fail(`gen_dashboard.py exited ${r.status}: ${r.stderr}`);
  } else if (fs.readFileSync(regen, 'utf8') !== fs.readFileSync(path.join(dashDir, 'memtrace.json'), 'utf8')) {
    fail('dashboards/memtrace.json differs from what dashboards/gen_dashboard.py writes; ' +
      'run python3 dashboards/gen_dashboard.py');
  } else {
    ok('dashboards/memtrace.json is what gen_dashboard.py writes');
  }
}

/* ---- the altered copies: each must be rejected, and with the expected message ---- */

const clone = (o) => JSON.parse(JSON.stringify(o));
const rename = (obj, from, to) => {
  obj[to] = obj[from];
  delete obj[from];
};
const allPanels = (d) => d.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const firstOf = (d, type) => allPanels(d).find((p) => p.type === type);
const variable = (d, name) => d.templating.list.find((v) => v.name === name);

// [name, change, a message tsc must report for the copy]. A change can also upset the
// match of its object against the other members of a union (an unknown panel type is then
// also checked as a bar gauge); those further errors are allowed, the named one is required.
const typeCases = [
  ['gridPos.w as a string', (d) => { firstOf(d, 'timeseries').gridPos.w = '12'; },
    /TS2322: Type 'string' is not assignable to type 'number'/],
  ['panel "gridPos" misspelled', (d) => { rename(firstOf(d, 'timeseries'), 'gridPos', 'gridpos'); },
    /TS2353: Object literal may only specify known properties, and '"gridpos"' does not exist/],
  ['panel of an unknown plugin type', (d) => { firstOf(d, 'timeseries').type = 'timeseriess'; },
    /TS2820: Type '"timeseriess"' is not assignable to type '"timeseries" \| "bargauge" \| "row"'/],
  ['row "collapsed" misspelled', (d) => { rename(firstOf(d, 'row'), 'collapsed', 'colapsed'); },
    /TS2353: Object literal may only specify known properties, and '"colapsed"' does not exist/],
  ['row without "collapsed"', (d) => { delete firstOf(d, 'row').collapsed; },
    /Property 'collapsed' is missing/],
  ['templating variable of an unknown type', (d) => { variable(d, 'instance').type = 'querry'; },
    /TS2820: Type '"querry"' is not assignable to type 'VariableType'/],
  ['templating variable "name" misspelled', (d) => { rename(variable(d, 'pid'), 'name', 'nmae'); },
    /TS2353: Object literal may only specify known properties, and '"nmae"' does not exist/],
  ['templating variable refresh not a VariableRefresh', (d) => { variable(d, 'tag').refresh = 3; },
    /TS2322: Type '3' is not assignable to type 'VariableRefresh/],
  ['datasource as a bare name (pre-7 style)', (d) => { firstOf(d, 'timeseries').datasource = 'Prometheus'; },
    /TS2559: Type 'string' has no properties in common with type '\{ type\?: string/],
  ['Prometheus target "expr" misspelled', (d) => { rename(firstOf(d, 'timeseries').targets[0], 'expr', 'exp'); },
    /TS2353: Object literal may only specify known properties, and '"exp"' does not exist/],
  ['Prometheus target format unknown', (d) => { firstOf(d, 'timeseries').targets[0].format = 'timeseries'; },
    /TS2820: Type '"timeseries"' is not assignable to type '"table" \| "time_series" \| "heatmap"/],
  ['time series legend displayMode unknown', (d) => { firstOf(d, 'timeseries').options.legend.displayMode = 'tabel'; },
    /TS2820: Type '"tabel"' is not assignable to type '"list" \| "table" \| "hidden"/],
  ['time series field config custom misspelled', (d) => { rename(firstOf(d, 'timeseries').fieldConfig.defaults.custom, 'fillOpacity', 'fillOpactiy'); },
    /TS2353: Object literal may only specify known properties, and '"fillOpactiy"' does not exist/],
  ['time series tooltip without "sort"', (d) => { delete firstOf(d, 'timeseries').options.tooltip.sort; },
    /TS2741: Property 'sort' is missing/],
  ['bar gauge with time series custom field config', (d) => { firstOf(d, 'bargauge').fieldConfig.defaults.custom = { lineWidth: 1 }; },
    /TS2322: Type '\{ lineWidth: number; \}' is not assignable to type 'undefined'/],
  ['bar gauge without "displayMode"', (d) => { delete firstOf(d, 'bargauge').options.displayMode; },
    /TS2741: Property 'displayMode' is missing/],
  ['dashboard without "schemaVersion"', (d) => { delete d.schemaVersion; },
    /Property 'schemaVersion' is missing/],
];

/* ---- one tsc run over the dashboards and the altered copies ---- */

const schemaImport = JSON.stringify(path.join(here, 'dashboard'));
// The JSON starts on the first line so that tsc's line numbers are the file's.
const asTs = (text) => `import type { Dashboard } from ${schemaImport}; export const dashboard: Dashboard = ${text};\n`;
const files = [];
for (const [f, text] of texts) {
  const ts = path.join(tmp, f.replace(/\.json$/, '.ts'));
  fs.writeFileSync(ts, asTs(text));
  files.push(ts);
}
const base = JSON.parse(texts.get('memtrace.json') ?? 'null');
const caseFile = (i) => path.join(tmp, `altered_${i}.ts`);
if (base) {
  typeCases.forEach(([, change], i) => {
    const d = clone(base);
    change(d);
    fs.writeFileSync(caseFile(i), asTs(JSON.stringify(d, null, 2)));
    files.push(caseFile(i));
  });
}
fs.writeFileSync(path.join(tmp, 'tsconfig.json'), JSON.stringify({
  compilerOptions: {
    strict: true, noEmit: true, target: 'es2022', module: 'esnext',
    moduleResolution: 'bundler', lib: ['es2022'], types: [], skipLibCheck: true,
  },
  files,
}, null, 2));
const r = spawnSync(process.execPath, [tsc, '-p', path.join(tmp, 'tsconfig.json'), '--pretty', 'false'],
  { encoding: 'utf8', cwd: tmp });
if (r.error || r.status === null) {
  fail(`tsc did not run: ${r.error ?? r.signal}`);
  process.exit(1);
}

// tsc --pretty false: "FILE(LINE,COL): error TSnnnn: message", continued on indented lines.
const errors = new Map();
let last = null;
for (const line of r.stdout.split('\n')) {
  const m = /^(.*?)\((\d+),(\d+)\): error (.*)$/.exec(line);
  if (m) {
    last = { line: Number(m[2]), text: m[4] };
    const k = path.resolve(tmp, m[1]);
    if (!errors.has(k)) errors.set(k, []);
    errors.get(k).push(last);
  } else if (last && /^\s/.test(line)) {
    last.text += `\n${line}`;
  } else if (line.trim()) {
    last = null;
    fail(`tsc: ${line}`);
  }
}

// An error elsewhere (dashboard.ts, after a schema update) would leave the types unchecked.
const known = new Set(files);
for (const [k, errs] of errors) {
  if (!known.has(k)) for (const e of errs) fail(`${k}:${e.line}: ${e.text}`);
}
if (r.status !== 0 && errors.size === 0) fail(`tsc exited ${r.status}: ${r.stdout}${r.stderr}`);

for (const f of texts.keys()) {
  const errs = errors.get(path.join(tmp, f.replace(/\.json$/, '.ts'))) ?? [];
  for (const e of errs) fail(`dashboards/${f}:${e.line}: ${e.text}`);
  if (!errs.length) ok(`dashboards/${f} matches @grafana/schema ${version('@grafana/schema')}`);
}
typeCases.forEach(([name, , want], i) => {
  const errs = errors.get(caseFile(i)) ?? [];
  if (!errs.length) {
    fail(`altered copy accepted: ${name}`);
  } else if (!errs.some((e) => want.test(e.text))) {
    fail(`altered copy "${name}" rejected, but not for ${want}:\n  ` +
      errs.map((e) => e.text).join('\n  '));
  } else {
    const e = errs.find((x) => want.test(x.text));
    const shown = e.text.split('\n').find((l) => want.test(l)) ?? e.text.split('\n')[0];
    ok(`rejected: ${name}: line ${e.line}: ${shown.trim().slice(0, 160)}` +
      (errs.length > 1 ? ` (+${errs.length - 1} more)` : ''));
  }
});

/* ---- what the CUE kinds constrain beyond the types, and references between fields ---- */

// Returns the problems of one dashboard object, each a sentence.
function structureProblems(d) {
  const out = [];
  const ids = new Map();
  for (const p of allPanels(d)) {
    const g = p.gridPos ?? {};
    // dashboard_kind.cue: w: int & >0 & <=24, h: int & >0, x: int & >=0 & <24, y: int & >=0;
    // and a panel that would overflow the 24 columns is moved by Grafana, not shown as laid out.
    const ints = ['x', 'y', 'w', 'h'].every((k) => Number.isInteger(g[k]));
    if (!ints || g.w <= 0 || g.h <= 0 || g.x < 0 || g.y < 0 || g.x + g.w > 24) {
      out.push(`panel ${p.id} "${p.title}": gridPos ${JSON.stringify(g)} is not inside the 24-column grid`);
    }
    if (ids.has(p.id)) out.push(`panel id ${p.id} used by "${ids.get(p.id)}" and "${p.title}"`);
    ids.set(p.id, p.title);
    const refIds = (p.targets ?? []).map((t) => t.refId);
    if (new Set(refIds).size !== refIds.length) {
      out.push(`panel ${p.id} "${p.title}": refIds ${refIds.join(',')} repeat`);
    }
  }
  const vars = new Map();
  for (const v of d.templating?.list ?? []) {
    if (vars.has(v.name)) out.push(`variable ${v.name} defined twice`);
    vars.set(v.name, v);
  }
  // $name, ${name} and ${name:format}; Grafana's own start with __.
  const uses = (s, where) => {
    for (const m of String(s).matchAll(/\$(?:\{(\w+)(?::\w+)?\}|(\w+))/g)) {
      const name = m[1] ?? m[2];
      if (!name.startsWith('__') && !vars.has(name)) out.push(`${where} uses $${name}, which is no variable`);
    }
  };
  const dsRef = (ds, where) => {
    if (!ds?.uid) return;
    uses(ds.uid, where);
    const m = /^\$\{?(\w+)\}?$/.exec(ds.uid);
    if (m && vars.has(m[1]) && vars.get(m[1]).type !== 'datasource') {
      out.push(`${where}: datasource uid ${ds.uid} names a variable of type ${vars.get(m[1]).type}`);
    }
  };
  for (const v of vars.values()) {
    dsRef(v.datasource, `variable ${v.name}`);
    uses(typeof v.query === 'string' ? v.query : v.query?.query ?? '', `variable ${v.name}`);
  }
  for (const p of allPanels(d)) {
    dsRef(p.datasource, `panel ${p.id}`);
    for (const t of p.targets ?? []) {
      dsRef(t.datasource, `panel ${p.id} query ${t.refId}`);
      uses(t.expr ?? '', `panel ${p.id} query ${t.refId}`);
    }
  }
  return out;
}

for (const [f, text] of texts) {
  const problems = structureProblems(JSON.parse(text));
  for (const p of problems) fail(`dashboards/${f}: ${p}`);
  if (!problems.length) ok(`dashboards/${f}: grid, ids, refIds and variable references hold`);
}

const structureCases = [
  ['panel wider than the grid', (d) => { firstOf(d, 'timeseries').gridPos.w = 30; },
    /gridPos .* is not inside the 24-column grid/],
  ['panel overflowing the right edge', (d) => { allPanels(d).find((p) => p.gridPos.x === 12).gridPos.w = 13; },
    /gridPos .* is not inside the 24-column grid/],
  ['two panels with one id', (d) => { firstOf(d, 'bargauge').id = firstOf(d, 'timeseries').id; },
    /panel id \d+ used by/],
  ['two queries with one refId', (d) => {
    const p = allPanels(d).find((q) => (q.targets ?? []).length > 1);
    p.targets[1].refId = p.targets[0].refId;
  }, /refIds .* repeat/],
  ['query naming an undefined variable', (d) => {
    const t = firstOf(d, 'timeseries').targets[0];
    t.expr = t.expr.replace('$instance', '$nodes');
  }, /uses \$nodes, which is no variable/],
  ['datasource uid naming a query variable', (d) => { firstOf(d, 'timeseries').datasource.uid = '${instance}'; },
    /datasource uid \$\{instance\} names a variable of type query/],
];
if (base) {
  for (const [name, change, want] of structureCases) {
    const d = clone(base);
    change(d);
    const problems = structureProblems(d);
    if (!problems.length) fail(`altered copy accepted: ${name}`);
    else if (!problems.every((p) => want.test(p))) fail(`altered copy "${name}": ${problems.join('; ')}`);
    else ok(`rejected: ${name}: ${problems[0]}`);
  }
}

console.log(`${failures ? 'FAIL' : 'ok'}: ${texts.size} dashboard(s), ` +
  `${typeCases.length + structureCases.length} altered copies; @grafana/schema ` +
  `${version('@grafana/schema')}, @grafana/grafana-foundation-sdk ` +
  `${version('@grafana/grafana-foundation-sdk')}, typescript ${version('typescript')}`);
process.exit(failures ? 1 : 0);
