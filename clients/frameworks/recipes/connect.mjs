// The one IdemTools of a process: one MCP connection to idemgate for every
// run, with make run's address and agent token unless the environment says
// otherwise (IDEMGATE_MCP_URL, IDEMGATE_TOKEN).
import { readFileSync } from "node:fs";
import { IdemTools } from "@idemgate/client/tools";

export const idem = new IdemTools({
  url: process.env.IDEMGATE_MCP_URL ?? "http://127.0.0.1:8081/mcp",
  token: process.env.IDEMGATE_TOKEN ?? readFileSync("data/agent.token", "utf8").trim(),
});
