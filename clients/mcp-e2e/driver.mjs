// Drives idemgate's MCP server over streamable HTTP with the official
// TypeScript SDK client: lists the tools, calls one, then calls it again from
// a new MCP session (as a reconnected agent would) in the same idemgate
// session. Prints what it saw as one JSON object.
//
// usage: [IDEMGATE_TOKEN=idg_...] node driver.mjs URL SESSION TOOL ARGS_JSON
// (the token is sent as Authorization: Bearer on every request)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, session, tool, argsJSON] = process.argv.slice(2);
if (!url || !tool) {
  console.error("usage: node driver.mjs URL SESSION TOOL ARGS_JSON");
  process.exit(2);
}
const args = JSON.parse(argsJSON ?? "{}");

async function connect() {
  const client = new Client({ name: "idemgate-e2e", version: "0.1.0" });
  const token = process.env.IDEMGATE_TOKEN;
  const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit });
  await client.connect(transport);
  return { client, transport };
}

async function callOnce(client) {
  return client.callTool({ name: tool, arguments: args, _meta: { "io.idemgate/session": session } });
}

const out = { sessions: [] };
const a = await connect();
out.protocol = a.transport.protocolVersion ?? null;
out.sessions.push(a.transport.sessionId);
const listed = await a.client.listTools();
out.tools = Object.fromEntries(listed.tools.map((t) => [t.name, { annotations: t.annotations, description: t.description, inputSchema: t.inputSchema }]));
out.first = await callOnce(a.client);
await a.transport.terminateSession();
await a.client.close();

const b = await connect();
out.sessions.push(b.transport.sessionId);
out.again = await callOnce(b.client);
try {
  await b.client.callTool({ name: "no_such_tool", arguments: {} });
  out.unknown = "no error";
} catch (err) {
  out.unknown = String(err.message ?? err);
}
await b.client.close();
console.log(JSON.stringify(out));
