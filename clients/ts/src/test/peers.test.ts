/**
 * The framework adapters' dependencies stay out of the base client's
 * install: each is an optional peer dependency, and the lock file installs
 * none of the frameworks.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

const ROOT = new URL("../../", import.meta.url);
const FRAMEWORKS = ["ai", "@openai/agents", "@langchain/core"];

test("the adapters' dependencies are optional peers, and the base install has no framework", () => {
  const pkg = JSON.parse(readFileSync(new URL("package.json", ROOT), "utf8")) as {
    dependencies: Record<string, string>;
    peerDependencies: Record<string, string>;
    peerDependenciesMeta: Record<string, { optional?: boolean }>;
    exports: Record<string, unknown>;
  };
  for (const name of [...FRAMEWORKS, "@modelcontextprotocol/sdk"]) {
    assert.ok(pkg.peerDependencies[name], `${name} is a peer dependency`);
    assert.equal(pkg.peerDependenciesMeta[name]?.optional, true, `${name} is optional: npm install @idemgate/client must not install it`);
    assert.equal(pkg.dependencies[name], undefined, `${name} is not a dependency`);
  }
  for (const sub of ["./tools", "./ai-sdk", "./openai-agents", "./langchain"]) assert.ok(pkg.exports[sub], `${sub} is exported`);
  const lock = JSON.parse(readFileSync(new URL("package-lock.json", ROOT), "utf8")) as { packages: Record<string, unknown> };
  for (const name of FRAMEWORKS) assert.equal(lock.packages[`node_modules/${name}`], undefined, `the lock installs ${name}`);
});
