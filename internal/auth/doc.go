// Package auth is the bearer tokens of idemgate's front doors: the tokens
// file that the HTTP front door (internal/httpapi) and the MCP server
// (internal/mcpgate) both read, one line per caller with the SHA-256 of its
// secret, its role and its namespace, and the namespace rule that scopes a
// caller's sessions: a caller of namespace N runs in sessions "N" and
// "N/<session>" and reaches only records of those. The file holds no
// secret; `gateway token` makes a token and its line.
package auth
