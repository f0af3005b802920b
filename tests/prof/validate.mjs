// Validates NDJSON files against the telemetry JSON Schema (draft 2020-12) with ajv.
// usage: node validate.mjs SCHEMA FILE... ; a FILE written as !FILE must have every
// line rejected (negative cases). Exit 0 = as expected, 1 = not, 77 = ajv missing
// (run `npm ci --prefix tests/prof`), the meson "skip" code.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

let Ajv2020;
try {
  const require = createRequire(import.meta.url);
  Ajv2020 = require("ajv/dist/2020.js");
  Ajv2020 = Ajv2020.default ?? Ajv2020;
} catch (e) {
  console.log("ajv not installed: npm ci --prefix tests/prof");
  process.exit(77);
}

const [schemaPath, ...files] = process.argv.slice(2);
if (!schemaPath || files.length === 0) {
  console.error("usage: node validate.mjs SCHEMA FILE...");
  process.exit(2);
}
const ajv = new Ajv2020({ allErrors: true, strict: true, strictRequired: false });
const validate = ajv.compile(JSON.parse(readFileSync(schemaPath, "utf8")));

let bad = 0;
let checked = 0;
for (let f of files) {
  const negative = f.startsWith("!");
  if (negative) f = f.slice(1);
  const lines = readFileSync(f, "utf8").split("\n").filter((l) => l.length > 0);
  if (lines.length === 0) {
    console.error(`${f}: no lines`);
    bad++;
  }
  lines.forEach((line, i) => {
    checked++;
    let ok;
    try {
      ok = validate(JSON.parse(line));
    } catch (e) {
      ok = false;
    }
    if (ok === negative) {
      bad++;
      const why = negative ? "accepted but should be rejected" : ajv.errorsText(validate.errors);
      console.error(`${f}:${i + 1}: ${why}\n  ${line.slice(0, 300)}`);
    }
  });
}
console.log(`${checked} lines checked, ${bad} unexpected`);
process.exit(bad ? 1 : 0);
