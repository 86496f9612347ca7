package logging

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNew(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"json", "console"} {
		log, err := New(format, "debug")
		require.NoError(t, err)
		require.True(t, log.Core().Enabled(-1), "debug is on")
	}
	_, err := New("xml", "info")
	require.ErrorContains(t, err, "--log-format \"xml\": use json or console")
	_, err = New("json", "loud")
	require.ErrorContains(t, err, "--log-level \"loud\": use debug, info, warn or error")
}

func TestRegister(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := Register(fs, Flags{})
	require.NoError(t, fs.Parse(nil))
	require.Equal(t, Flags{Level: "info", Format: "json"}, *f, "the defaults")
	log, err := f.Logger()
	require.NoError(t, err)
	require.False(t, log.Core().Enabled(-1), "debug is off at info")

	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	f = Register(fs, Flags{Format: "console", Level: "warn"})
	require.NoError(t, fs.Parse([]string{"--log-level", "debug"}))
	require.Equal(t, Flags{Level: "debug", Format: "console"}, *f)
}
