package logging

import (
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
	require.ErrorContains(t, err, "use json or console")
	_, err = New("json", "loud")
	require.ErrorContains(t, err, "use debug, info, warn or error")
}
