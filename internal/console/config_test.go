package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
)

// New refuses a config it cannot serve, saying what to give, and takes
// the rest.
func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	cl, err := client.New(natstest.Connect(t, natstest.RunServer(t).ClientURL()))
	require.NoError(t, err)
	_, line, err := auth.NewToken(auth.RoleOperator, "*", "ops")
	require.NoError(t, err)
	toks, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	admit := LimiterFunc(func(*auth.Token) (func(), time.Duration, string) { return func() {}, 0, "" })
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Tokens: toks, Limiter: admit}, "no client"},
		{Config{Client: cl, Limiter: admit}, "no tokens"},
		{Config{Client: cl, Tokens: toks}, "no limiter"},
		{Config{Client: cl, Tokens: toks, Limiter: admit, MaxBodyBytes: -1}, "max body bytes -1"},
		{Config{Client: cl, Tokens: toks, Limiter: admit, ListMaxScan: -1}, "list max scan -1"},
		{Config{Client: cl, Tokens: toks, Limiter: admit, WorkerMetricsEvery: time.Millisecond}, "use at least 1s"},
		{Config{Client: cl, Tokens: toks, Limiter: admit, WorkerMetrics: []string{"localhost:9090/metrics"}}, "give a worker's http(s)://host:port/metrics"},
	} {
		_, err := New(c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	c, err := New(Config{Client: cl, Tokens: toks, Limiter: admit, WorkerMetrics: []string{"http://127.0.0.1:9090/metrics"}})
	require.NoError(t, err)
	c.shutdown()
}
