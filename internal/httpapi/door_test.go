package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/httpapi"
	"github.com/idemgate/idemgate/internal/httpdoor/httpdoortest"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
)

// The HTTP front door answers a missing, malformed or unknown token, an
// agent's token on an operator's route and a body over the limit as the
// MCP server does (internal/httpdoor's table).
func TestFaultsAreAnsweredAsByEveryDoor(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	cl, err := client.New(nc)
	require.NoError(t, err)
	secret, line, err := auth.NewToken(auth.RoleAgent, "team-a", "agent")
	require.NoError(t, err)
	tokens, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	const maxBody = 64
	s, err := httpapi.New(nc, cl, nil, httpapi.Config{Tokens: tokens, MaxBodyBytes: maxBody})
	require.NoError(t, err)
	httpdoortest.Check(t, httpdoortest.Door{
		Handler: s.Handler(), Method: http.MethodPost, Path: "/v1/tools/echo", Token: secret, MaxBody: maxBody,
		Forbidden: func() *http.Request { return httptest.NewRequest(http.MethodGet, "/v1/operations", nil) },
	})
}
