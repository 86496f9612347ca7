package mcpgate

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/httpdoor/httpdoortest"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
)

// The MCP server's HTTP transport answers a missing, malformed or unknown
// token, another token's session and a body over the limit as the HTTP
// front door does (internal/httpdoor's table), its challenges naming the
// protected resource metadata.
func TestFaultsAreAnsweredAsByEveryDoor(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	secrets, lines := map[string]string{}, []string{}
	for _, name := range []string{"a", "b"} {
		secret, line, err := auth.NewToken(auth.RoleAgent, "team-"+name, name)
		require.NoError(t, err)
		secrets[name], lines = secret, append(lines, line)
	}
	tokens, err := auth.ParseTokens(strings.NewReader(strings.Join(lines, "\n")))
	require.NoError(t, err)
	cl, err := client.New(nc)
	require.NoError(t, err)
	g, err := New(nc, cl, nil, Config{Tokens: tokens})
	require.NoError(t, err)
	t.Cleanup(g.door.close)
	h := g.HTTPHandler()
	header := http.Header{"Accept": {"application/json, text/event-stream"}, "Content-Type": {"application/json"}}
	post := func(body, token, sid string) *http.Request {
		req := httptest.NewRequest(http.MethodPost, HTTPPath, strings.NewReader(body))
		for k, vs := range header {
			req.Header[k] = vs
		}
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		return req
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, secrets["b"], ""))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	sid := rec.Header().Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)

	httpdoortest.Check(t, httpdoortest.Door{
		Handler: h, Method: http.MethodPost, Path: HTTPPath, Header: header, Token: secrets["a"], MaxBody: maxBody, Metadata: true,
		Forbidden: func() *http.Request { return post(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, "", sid) },
	})
}
