package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// --config is read as the gateway's and the worker's are: the command line
// wins, then the environment, then the file, then the default; the flags
// that confirm a dangerous act are the command line's only.
func TestConfigFilePrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "submit.yaml")
	submit := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr)
		return code, stderr.String()
	}
	require.NoError(t, os.WriteFile(file, []byte("log-level: from-file\n"), 0o600))
	code, stderr := submit("get", "k", "--config", file)
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, `"from-file"`, "the file sets a flag")
	t.Setenv("IDEMGATE_LOG_LEVEL", "from-env")
	_, stderr = submit("get", "k", "--config", file)
	require.Contains(t, stderr, `"from-env"`, "the environment wins over the file")
	_, stderr = submit("get", "k", "--config", file, "--log-level", "from-flag")
	require.Contains(t, stderr, `"from-flag"`, "the command line wins over both")

	require.NoError(t, os.Unsetenv("IDEMGATE_LOG_LEVEL")) // t.Setenv above restores it
	require.NoError(t, os.WriteFile(file, []byte("force: true\n"), 0o600))
	code, stderr = submit("forget", "k", "--config", file)
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, "submit.yaml:1: force is for the command line only", "a file confirms nothing")
}
