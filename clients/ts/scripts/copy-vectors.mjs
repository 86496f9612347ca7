// Copies the protocol's test vectors (pkg/intent/testdata of the repository)
// into dist/testdata, so that the built package's tests read only the
// package's own files. src/test/vectors.test.ts checks the copy is still
// byte-identical to the repository's.
import { copyFileSync, existsSync, mkdirSync } from "node:fs";

const from = new URL("../../../pkg/intent/testdata/", import.meta.url);
const to = new URL("../dist/testdata/", import.meta.url);
const files = ["vectors.json", "invalid.json"];

mkdirSync(to, { recursive: true });
for (const f of files) {
  const src = new URL(f, from);
  if (!existsSync(src)) {
    console.error(`copy-vectors: ${src.pathname} is missing: build the package inside the idemgate repository`);
    process.exit(1);
  }
  copyFileSync(src, new URL(f, to));
}
