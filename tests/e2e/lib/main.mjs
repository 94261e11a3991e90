// main.mjs -- entry of the e2e suite: sets up the temp root and exit handlers, imports every
// *.test.mjs (sorted by file name) and runs the tests sequentially.
//   node lib/main.mjs [name-regex]
// The argument selects tests for a developer's run: the others are not run and not counted.
// FXE2E_FILTER=regex (run only these) and FXE2E_EXCLUDE=regex (run all but these), as a suite run
// sets them (tests/run.sh --e2e-filter, the TSan pass): every test left out is reported as
// "[  SKIPPED ]" with the reason (FXE2E_SKIP_REASON, or a default naming the variable), so the
// closing counts show it. (FXE2E_SKIP_REASON is the reason given for tests FXE2E_FILTER leaves out.)
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { runAll, trapAsyncErrors, registeredNames } from "./runner.mjs";
import { installExitHandlers, setRoot } from "./stack.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const suiteDir = path.resolve(here, "..");

let root = process.env.FXT_TMPDIR;
let ownRoot = false;
if (root) {
  root = path.join(root, "e2e");
  fs.mkdirSync(root, { recursive: true });
} else {
  root = fs.mkdtempSync(path.join(os.tmpdir(), "fluxon-e2e-"));
  ownRoot = true;
}
setRoot(root);
const keep = !!process.env.FXE2E_KEEP;
if (keep) console.log(`e2e: FXE2E_KEEP set: test directories stay under ${root}`);
installExitHandlers(() => {
  if (ownRoot && !keep) fs.rmSync(root, { recursive: true, force: true });
});
trapAsyncErrors();

const pattern = process.argv[2];
const filter = pattern ? new RegExp(pattern) : null;
const only = process.env.FXE2E_FILTER ? new RegExp(process.env.FXE2E_FILTER) : null;
const exclude = process.env.FXE2E_EXCLUDE ? new RegExp(process.env.FXE2E_EXCLUDE) : null;
const skipReason = process.env.FXE2E_SKIP_REASON;
const skip = (name) => {
  if (only && !only.test(name)) return skipReason || `not selected by FXE2E_FILTER=${only.source}`;
  if (exclude && exclude.test(name)) return `excluded by FXE2E_EXCLUDE=${exclude.source}`;
  return null;
};

const files = fs.readdirSync(suiteDir).filter((f) => f.endsWith(".test.mjs")).sort();
for (const f of files) await import(pathToFileURL(path.join(suiteDir, f)).href);
// tests/e2e/scale/: scale tests kept out of `make test` (the 2-bridges-vs-1 bench row); run
// them with FXE2E_SCALE=1.
if (process.env.FXE2E_SCALE) {
  const scaleDir = path.join(suiteDir, "scale");
  for (const f of fs.readdirSync(scaleDir).filter((x) => x.endsWith(".test.mjs")).sort())
    await import(pathToFileURL(path.join(scaleDir, f)).href);
}

if (only) console.log(`e2e: FXE2E_FILTER=${only.source}: the other tests are reported as skipped`);
if (only && !registeredNames().some((n) => only.test(n))) {
  // a selection that selects nothing is a typo, not a pass
  console.log(`e2e: FXE2E_FILTER=${only.source} matches no test`);
  process.exit(1);
}
if (exclude) console.log(`e2e: FXE2E_EXCLUDE=${exclude.source}: those tests are reported as skipped`);
const failed = await runAll({ root, filter, skip });
if (!ownRoot && !keep) fs.rmSync(root, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
