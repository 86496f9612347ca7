package envflag

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPrecedence(t *testing.T) {
	t.Setenv("TEST_ACK_WAIT", "7s")
	t.Setenv("TEST_CONCURRENCY", "9")
	t.Setenv("NATS_URL", "nats://alias:4222")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	ackWait := fs.Duration("ack-wait", time.Second, "")
	conc := fs.Int("concurrency", 1, "")
	url := fs.String("nats-url", "", "")
	other := fs.String("other", "default", "")
	require.NoError(t, fs.Parse([]string{"--concurrency", "3"}))
	require.NoError(t, Apply(fs, "TEST", map[string]string{"nats-url": "NATS_URL"}))
	require.Equal(t, 3, *conc, "the command line wins")
	require.Equal(t, 7*time.Second, *ackWait, "then the environment")
	require.Equal(t, "nats://alias:4222", *url, "then the alias")
	require.Equal(t, "default", *other, "then the default")

	t.Setenv("TEST_NATS_URL", "nats://own:4222")
	fs2 := flag.NewFlagSet("y", flag.ContinueOnError)
	url2 := fs2.String("nats-url", "", "")
	require.NoError(t, fs2.Parse(nil))
	require.NoError(t, Apply(fs2, "TEST", map[string]string{"nats-url": "NATS_URL"}))
	require.Equal(t, "nats://own:4222", *url2, "the prefixed variable wins over the alias")
}

func TestBadValueNamesTheVariable(t *testing.T) {
	t.Setenv("TEST_ACK_WAIT", "soon")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("ack-wait", time.Second, "")
	require.NoError(t, fs.Parse(nil))
	require.ErrorContains(t, Apply(fs, "TEST", nil), `environment TEST_ACK_WAIT="soon"`)
}
