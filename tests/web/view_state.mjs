// `memtrace view` of PyTorch snapshots as users' own files have them: one without a trace
// (torch.cuda.memory._snapshot() with no history recorded, which every reader refused as
// "out of memory"), and one whose trace begins in the middle of the run (PyTorch keeps the
// last max_entries events). /state says which, and gives the memory the file's segments
// hold at its end (before, the mid-run one lacked all that came before its trace); the page
// says "a PyTorch snapshot", not "exited: clean", that a state has no history, and how many
// trace entries of actions memtrace does not model (a newer PyTorch's) were skipped.
//
// An expandable segment whose pages a trace begun mid-run maps and unmaps is one mapped run
// at the end, as the file says (before, only the 2 MiB its trace mapped).
//
//   node view_state.mjs MEMTRACE STATE_SNAPSHOT MIDRUN_SNAPSHOT ALL_ACTIONS_SNAPSHOT
//                       EXPANDABLE_MIDRUN_SNAPSHOT
// tests/snapshot/data/v2_state_only.pickle: 8 MiB + 512 B allocated, 22 MiB reserved;
// tests/snapshot/data/v2_midrun.pickle: 10 MiB allocated, 22 MiB reserved at its end;
// tests/snapshot/data/v2_all_actions_p4.pickle: one entry of an action not modelled;
// tests/snapshot/data/v2_expandable_midrun.pickle: 5 MiB allocated in one run of 6 MiB.
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { failView, getJson as get, launchChromium, openProcess, serveView } from './view_serve.mjs';

const [memtrace, stateSnap, midrunSnap, allSnap, xSnap] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const MiB = 1 << 20;
const want = [
  { file: stateSnap, snapshot: 'state', allocated: 8 * MiB + 512, reserved: 22 * MiB, skipped: 0 },
  { file: midrunSnap, snapshot: 'trace', allocated: 10 * MiB, reserved: 22 * MiB, skipped: 0 },
  { file: allSnap, snapshot: 'trace', skipped: 1 },
  { file: xSnap, snapshot: 'trace', allocated: 5 * MiB, reserved: 6 * MiB, skipped: 0,
    segments: [[0x7F4000000000, 6 * MiB, 'mapped']] },
];
let view = null;

const fail = (msg) => failView(view, msg);

try {
  for (const w of want) {
    const served = await serveView(memtrace, [w.file]);
    view = served.proc;
    const url = served.url;
    const st = await get(url, '/state');
    const p = st.processes[0];
    if (p.snapshot !== w.snapshot)
      fail(`${w.file}: /state says snapshot ${p.snapshot}, want ${w.snapshot}`);
    if (p.skipped_entries !== w.skipped)
      fail(`${w.file}: /state says ${p.skipped_entries} skipped entries, want ${w.skipped}`);
    if (w.allocated !== undefined && (p.allocated_bytes !== w.allocated || p.reserved_bytes !== w.reserved))
      fail(`${w.file}: /state gives ${p.allocated_bytes} allocated, ${p.reserved_bytes} reserved; ` +
        `want ${w.allocated}, ${w.reserved} (the file's segments at its end)`);
    if (w.segments) {
      const got = (p.segments || []).map((s) => [s.addr, s.size, s.kind]);
      if (JSON.stringify(got) !== JSON.stringify(w.segments))
        fail(`${w.file}: /state's segments are ${JSON.stringify(got)}, want ${JSON.stringify(w.segments)}`);
    }
    console.log(`ok: ${w.file}: snapshot ${p.snapshot}, ${p.allocated_bytes} B allocated, ` +
      `${p.reserved_bytes} B reserved`);
    const browser = await launchChromium(here);
    if (browser) {
      const page = await openProcess(browser, url, p.pid);
      const re = w.snapshot === 'state' ? 'a PyTorch snapshot, its state only \\(no history'
        : w.skipped ? `a PyTorch snapshot; ${w.skipped} trace entries of actions memtrace does not model were skipped$`
          : 'a PyTorch snapshot$';
      try {
        await page.waitForFunction((re) => new RegExp(re).test(document.getElementById('title').textContent) &&
          / · snapshot$/.test(document.querySelector('#procs tr[data-pid] td').textContent),
        re, { timeout: 30000 });
      } catch (e) {
        const got = await page.evaluate(() => ({
          title: document.getElementById('title').textContent,
          row: document.querySelector('#procs tr[data-pid] td').textContent }));
        await browser.close();
        fail(`${w.file}: the page does not say what the file is: ${JSON.stringify(got)}`);
      }
      const title = await page.evaluate(() => document.getElementById('title').textContent);
      await browser.close();
      console.log(`ok: the page says '${title}'`);
    }
    view.kill('SIGINT');
    view = null;
  }
  process.exit(0);
} catch (e) {
  fail(e.stack || String(e));
}
