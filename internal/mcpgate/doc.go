// Package mcpgate is idemgate's MCP front door: an MCP server whose tools are
// the tools the workers serve (their catalogue), so that an agent runtime
// speaking the Model Context Protocol gets at-most-once execution per
// operation without a client library.
//
// Each tools/call becomes an intent submitted through pkg/client: its key is
// derived by the gate from the tool's key spec over the call's arguments,
// scoped by a stable session (the call's io.idemgate/session _meta field,
// else the Idem-Session HTTP header, else Config.Session), never by the MCP
// session or request id, which change on every reconnect and retry. The call
// returns the operation's recorded answer with the hint a model reads
// (internal/hint): what happened and what to do, in its structured content
// and as the text item after that content's JSON. Only a failure or a call
// refused for its input is a tool error; a conflict, denial or replay is an
// outcome, and an operation awaiting approval or uncertain returns at once
// with a reference for the idemgate_status tool. A client cancellation ends
// the wait, never the operation.
//
// Over HTTP (HTTPHandler) the gate takes bearer tokens of the HTTP front
// door's tokens file (internal/auth): a request without a valid one is
// answered 401 with the MCP authorization spec's challenge, and the
// protected resource metadata (RFC 9728) is served; the token's namespace
// scopes every session a call names and the operations idemgate_status
// reads. Protocol 2026-07-28 is served without sessions; earlier clients get
// sessions, capped per token and in all: a caller at a cap ends its least
// recently used idle session rather than being refused. Calls held open are
// capped too (429, with when a held call ends at the latest), and idle
// sessions end. stdio is the parent process's and takes no token.
// docs/mcp.md is the user's guide.
package mcpgate
