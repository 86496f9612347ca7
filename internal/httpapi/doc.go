// Package httpapi is idemgate's HTTP front door: tool calls with the
// semantics of the IETF Idempotency-Key header draft, the ledger's records,
// and an operator API, for callers that have an HTTP library and no NATS
// client. It is stateless: every call goes through pkg/client to the
// workers and the ledger, so any number of front doors may serve one
// installation.
//
// Routes (docs/http.md has the full contract; openapi.json is the machine-
// readable one, served at /v1/openapi.json):
//
//	POST   /v1/tools/{tool}                 call a tool: the body is its args
//	GET    /v1/tools                        the tool catalogue
//	GET    /v1/operations/{key}             an operation's record (?wait= for its final one)
//	GET    /v1/operations                   list records (operator)
//	POST   /v1/operations/{key}/approve     operator decisions: approve, deny, resolve, probe
//	DELETE /v1/operations/{key}             forget an operation so that it may run again (operator)
//	GET    /v1/dead-letters                 list dead letters (operator)
//	POST   /v1/dead-letters/{seq}/replay    replay one (operator)
//	GET    /console/                        the operator console (internal/console, docs/console.md)
//
// Every route but /v1/openapi.json and /healthz takes a bearer token from
// the tokens file (internal/auth): its role (agent or operator) decides the
// routes, its namespace the sessions it reaches. The console's pages take
// a session instead, started by pasting an operator token. Errors are RFC 9457
// problem details carrying the protocol's error code.
package httpapi
