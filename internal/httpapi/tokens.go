package httpapi

import "github.com/idemgate/idemgate/internal/auth"

// The front door's callers are the tokens of internal/auth, which the MCP
// server reads too.
type (
	// Token is one caller (auth.Token).
	Token = auth.Token
	// Tokens is the set of callers admitted (auth.Tokens).
	Tokens = auth.Tokens
)

// Roles and the all-namespaces mark, as internal/auth has them.
const (
	RoleAgent     = auth.RoleAgent
	RoleOperator  = auth.RoleOperator
	AllNamespaces = auth.AllNamespaces
)

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
