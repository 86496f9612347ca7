// Package httpdoortest checks that a front door answers the faults of
// internal/httpdoor as that package does: the same status, challenge and
// problem for a missing, malformed or unknown bearer token, a token not
// allowed the request, and a body over the limit. Each door's tests run
// Check on it, so that both doors are held to one table.
package httpdoortest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/httpdoor"
)

// Door is a front door under test.
type Door struct {
	// Handler serves the door.
	Handler http.Handler
	// Method and Path are a route that reads a body and takes Token.
	Method, Path string
	// Header is sent with every request besides Authorization (the MCP
	// transport's Accept, say). Default: none.
	Header http.Header
	// Token is the secret of a token the route takes.
	Token string
	// MaxBody is the route's body limit.
	MaxBody int
	// Forbidden, when set, makes a request that Token may not make, which
	// the door answers 403; Check adds Token to it.
	Forbidden func() *http.Request
	// Metadata reports that the door's challenges name its protected
	// resource metadata (resource_metadata).
	Metadata bool
}

// Fault is one fault and the answer every door gives it.
type Fault struct {
	Name  string
	Auth  string // the Authorization header; "valid" for the door's Token
	Body  string // "" for a small body; "over" for one over the limit, "chunked" for one over it without Content-Length
	forb  bool
	Want  int    // the status
	Code  string // the problem's code
	Error string // the challenge's error ("" for none; no challenge unless 401 or 403)
}

// Faults is the table: what each fault is answered with.
var Faults = []Fault{
	{Name: "no Authorization header", Auth: "", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized},
	{Name: "another scheme", Auth: "Basic dXNlcjpwYXNz", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized},
	{Name: "no token after Bearer", Auth: "Bearer ", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized},
	{Name: "two tokens", Auth: "Bearer idg_a idg_b", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized, Error: "invalid_token"},
	{Name: "not a b64token", Auth: "Bearer idg_a,b", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized, Error: "invalid_token"},
	{Name: "unknown token", Auth: "Bearer idg_not-a-token", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized, Error: "invalid_token"},
	{Name: "unknown token, scheme in lower case", Auth: "bearer idg_not-a-token", Want: http.StatusUnauthorized, Code: httpdoor.CodeUnauthorized, Error: "invalid_token"},
	{Name: "body over the limit", Auth: "valid", Body: "over", Want: http.StatusRequestEntityTooLarge, Code: httpdoor.CodeTooLarge},
	{Name: "body over the limit, no Content-Length", Auth: "valid", Body: "chunked", Want: http.StatusRequestEntityTooLarge, Code: httpdoor.CodeTooLarge},
	{Name: "token not allowed the request", Auth: "valid", forb: true, Want: http.StatusForbidden, Code: httpdoor.CodeForbidden, Error: "insufficient_scope"},
}

// Check sends each of Faults to d and fails t unless d answers it as the
// table says.
func Check(t *testing.T, d Door) {
	t.Helper()
	for _, f := range Faults {
		t.Run(f.Name, func(t *testing.T) {
			var req *http.Request
			switch {
			case f.forb && d.Forbidden == nil:
				t.Skip("the door has no request a valid token may not make")
			case f.forb:
				req = d.Forbidden()
			default:
				var body io.Reader = strings.NewReader("{}")
				switch f.Body {
				case "over":
					body = strings.NewReader(strings.Repeat(" ", d.MaxBody+1))
				case "chunked":
					body = io.MultiReader(strings.NewReader(strings.Repeat(" ", d.MaxBody+1)))
				}
				req = httptest.NewRequest(d.Method, d.Path, body)
				for k, vs := range d.Header {
					req.Header[k] = vs
				}
			}
			switch f.Auth {
			case "":
			case "valid":
				req.Header.Set("Authorization", "Bearer "+d.Token)
			default:
				req.Header.Set("Authorization", f.Auth)
			}
			rec := httptest.NewRecorder()
			d.Handler.ServeHTTP(rec, req)
			res := rec.Result()
			require.Equal(t, f.Want, res.StatusCode, rec.Body.String())
			require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
			var p struct {
				Type, Title, Code string
				Status            int
			}
			require.NoError(t, json.NewDecoder(bytes.NewReader(rec.Body.Bytes())).Decode(&p), rec.Body.String())
			require.Equal(t, f.Want, p.Status)
			require.Equal(t, f.Code, p.Code)
			require.Equal(t, "urn:idemgate:problem:"+f.Code, p.Type)
			require.Equal(t, httpdoor.Title(f.Code, f.Want), p.Title)

			challenge := res.Header.Get("WWW-Authenticate")
			if f.Want != http.StatusUnauthorized && f.Want != http.StatusForbidden {
				require.Empty(t, challenge)
				return
			}
			require.True(t, strings.HasPrefix(challenge, `Bearer realm="idemgate"`), challenge)
			require.Equal(t, d.Metadata, strings.Contains(challenge, "resource_metadata="), challenge)
			if f.Error == "" {
				require.NotContains(t, challenge, "error=", challenge)
				return
			}
			require.Contains(t, challenge, `error="`+f.Error+`"`)
			require.Contains(t, challenge, `error_description="`)
		})
	}
}
