package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClusterReadyShort runs one round of the cluster-ready scenario and
// checks that it prints every worker's time to ready. It asserts no speed.
func TestClusterReadyShort(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	err := clusterReadyMain(t.Context(), []string{"-rounds", "1", "-workers", "3", "-store-dir", t.TempDir(), "-timeout", "10m"}, &buf)
	t.Log("\n" + buf.String())
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`(?m)^round 1: ready after \d+\.\d\ds \d+\.\d\ds \d+\.\d\ds$`), buf.String())
}
