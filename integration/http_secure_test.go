package integration

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The front door as the shipped "gateway" NATS user (TLS, password, its own
// inbox), and listing from the shell as the "operator" user: every call it
// makes — tool calls, reads and watches, listing, forgetting, dead letters —
// is allowed, and nothing is refused to it or to the worker.
func TestSecureGateway(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	g := startGatewayAs(t, s, "gateway")

	first := g.call(t, agentA, "echo", `{"n":1}`)
	require.Equal(t, http.StatusOK, first.status, first.raw)
	again := g.call(t, agentA, "echo", `{"n":1}`)
	require.Equal(t, "true", again.header.Get(httpReplayed), again.raw)
	key := first.str("key")
	require.Equal(t, http.StatusOK, g.do(t, http.MethodGet, "/v1/operations/"+key+"?wait=5", agentA, "").status)
	require.Equal(t, http.StatusOK, g.do(t, http.MethodGet, "/v1/tools", agentA, "").status)
	list := g.do(t, http.MethodGet, "/v1/operations?tool=echo", operator, "")
	require.Equal(t, http.StatusOK, list.status, list.raw)
	require.Len(t, list.body["records"], 1)
	require.Equal(t, http.StatusOK, g.do(t, http.MethodGet, "/v1/dead-letters", operator, "").status)
	forgot := g.do(t, http.MethodDelete, "/v1/operations/"+key, operator, "")
	require.Equal(t, http.StatusOK, forgot.status, forgot.raw)

	cmd := exec.Command(bin("submit"), "list", "--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", "operator", "--nats-inbox-prefix", "_INBOX.operator")
	cmd.Env = append(cmd.Environ(), "IDEMGATE_NATS_PASSWORD="+s.password(t, "operator"))
	out := runClient(t, cmd)
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stderr, "0 records", "the forgotten record is gone")
	require.Empty(t, s.violations(), "the gateway, the operator and the worker were refused nothing")
}

// startGatewayAs runs a front door connected to s as user.
func startGatewayAs(t *testing.T, s *secureServer, user string) *gateway {
	t.Helper()
	g := startGatewayEnv(t, []string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, user)},
		"--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", user, "--nats-inbox-prefix", "_INBOX."+strings.ToLower(user))
	return g
}
