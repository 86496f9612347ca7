package httpdoor

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idemgate/idemgate/internal/auth"
)

// Bearer authenticates a request by the bearer token of its Authorization
// header (RFC 6750) against Tokens, and answers a request it refuses with
// the challenge the MCP authorization spec asks of an HTTP transport.
type Bearer struct {
	// Tokens are the callers admitted. Required.
	Tokens *auth.Tokens
	// Metadata, when set, is the URL of the protected resource metadata
	// (RFC 9728) of the resource r reached, named in every challenge as
	// resource_metadata. Default: none.
	Metadata func(r *http.Request) string
}

// Authenticate returns the token of r, or answers and returns false: 401
// with WWW-Authenticate: Bearer realm="idemgate" for a request with no
// bearer token (no Authorization header, another scheme, or no token after
// Bearer), and the same with error="invalid_token" for a malformed token
// (not one b64token) or one not in Tokens.
func (b Bearer) Authenticate(w http.ResponseWriter, r *http.Request) (*auth.Token, bool) {
	scheme, secret, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	secret = strings.TrimSpace(secret)
	switch {
	case !strings.EqualFold(scheme, "Bearer") || secret == "":
		w.Header().Set("WWW-Authenticate", b.challenge(r, ""))
		Problem(w, http.StatusUnauthorized, CodeUnauthorized, "send Authorization: Bearer <token> (a token of the tokens file; gateway token makes one)")
		return nil, false
	case !b64token(secret):
		const why = "the bearer token is malformed: one token of letters, digits and -._~+/ (RFC 6750)"
		w.Header().Set("WWW-Authenticate", b.challenge(r, "invalid_token", why))
		Problem(w, http.StatusUnauthorized, CodeUnauthorized, why)
		return nil, false
	}
	tok, ok := b.Tokens.Lookup(secret)
	if !ok {
		const why = "the bearer token is not in the tokens file"
		w.Header().Set("WWW-Authenticate", b.challenge(r, "invalid_token", why))
		Problem(w, http.StatusUnauthorized, CodeUnauthorized, why)
		return nil, false
	}
	return tok, true
}

// Forbid answers 403 for a token that may not make request r, with
// WWW-Authenticate: Bearer error="insufficient_scope" and the detail
// format says.
func (b Bearer) Forbid(w http.ResponseWriter, r *http.Request, format string, args ...any) {
	detail := fmt.Sprintf(format, args...)
	w.Header().Set("WWW-Authenticate", b.challenge(r, "insufficient_scope", detail))
	Problem(w, http.StatusForbidden, CodeForbidden, "%s", detail)
}

// challenge is the WWW-Authenticate value for r: the realm, the resource
// metadata when known, and the error and its description when given.
func (b Bearer) challenge(r *http.Request, errorAndDescription ...string) string {
	c := `Bearer realm="idemgate"`
	if b.Metadata != nil {
		c += fmt.Sprintf(", resource_metadata=%s", quote(b.Metadata(r)))
	}
	if len(errorAndDescription) > 0 && errorAndDescription[0] != "" {
		c += ", error=" + quote(errorAndDescription[0])
	}
	if len(errorAndDescription) > 1 {
		c += ", error_description=" + quote(errorAndDescription[1])
	}
	return c
}

// quote is s as an HTTP quoted-string.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// b64token reports whether s is an RFC 6750 b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func b64token(s string) bool {
	s = strings.TrimRight(s, "=")
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == '+', c == '/':
		default:
			return false
		}
	}
	return true
}
