// Copies the protocol's test vectors (pkg/intent/testdata of the repository),
// the receipt vectors (pkg/audit/testdata) and the package's ledger record
// vectors (src/test/testdata) into dist/testdata, so that the built
// package's tests read only the package's own files.
// src/test/vectors.test.ts and audit.test.ts check the copies are still
// byte-identical to the repository's.
import { copyFileSync, existsSync, mkdirSync } from "node:fs";

const to = new URL("../dist/testdata/", import.meta.url);
const files = [
  ["../../../pkg/intent/testdata/", "vectors.json"],
  ["../../../pkg/intent/testdata/", "invalid.json"],
  ["../../../pkg/audit/testdata/", "receipts.json"],
  ["../src/test/testdata/", "records.json"],
];

mkdirSync(to, { recursive: true });
for (const [dir, f] of files) {
  const src = new URL(f, new URL(dir, import.meta.url));
  if (!existsSync(src)) {
    console.error(`copy-vectors: ${src.pathname} is missing: build the package inside the idemgate repository`);
    process.exit(1);
  }
  copyFileSync(src, new URL(f, to));
}
