// Shared by the web tests that load the page: headless Chromium, when it can be had.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

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
