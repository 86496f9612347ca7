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
	_, err = New(nil, nil, Config{Tokens: toks, Limiter: admit})
	require.ErrorContains(t, err, "no client")
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Limiter: admit}, "no tokens"},
		{Config{Tokens: toks}, "no limiter"},
		{Config{Tokens: toks, Limiter: admit, MaxBodyBytes: -1}, "max body bytes -1"},
		{Config{Tokens: toks, Limiter: admit, ListMaxScan: -1}, "list max scan -1"},
		{Config{Tokens: toks, Limiter: admit, WorkerMetricsEvery: time.Millisecond}, "use at least 1s"},
		{Config{Tokens: toks, Limiter: admit, WorkerMetrics: []string{"localhost:9090/metrics"}}, "give a worker's http(s)://host:port/metrics"},
	} {
		_, err := New(cl, nil, c.cfg)
		require.ErrorContains(t, err, c.want)
	}
	c, err := New(cl, nil, Config{Tokens: toks, Limiter: admit, WorkerMetrics: []string{"http://127.0.0.1:9090/metrics"}})
	require.NoError(t, err)
	c.shutdown()
}
