/** The command line's exit statuses match the Go submit command's. */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { Result, Status } from "../index.js";
import { exitCode } from "../cli.js";

function res(status: Status, replayed: boolean): Result {
  return { key: "k", tool: "t", status, replayed, attempts: 1, completed_at: "2025-01-06T10:00:00Z" };
}

test("exit statuses", () => {
  const cases: [Status, boolean, number][] = [
    ["completed", false, 0],
    ["completed", true, 3],
    ["conflict", false, 4],
    ["failed", false, 5],
    ["failed", true, 5],
    ["rejected", false, 5],
    ["denied", true, 5],
    ["awaiting_approval", false, 6],
    ["uncertain", true, 6],
  ];
  for (const [status, replayed, code] of cases) {
    assert.equal(exitCode(res(status, replayed)), code, `${status} replayed=${replayed}`);
  }
});
