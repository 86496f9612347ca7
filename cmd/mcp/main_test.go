package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// --config is read as the gateway's and the worker's are: the command line
// wins, then the environment, then the file, then the default. The log
// level is a setting every source can give and run checks before it
// connects.
func TestConfigFilePrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mcp.yaml")
	require.NoError(t, os.WriteFile(file, []byte("log-level: from-file\n"), 0o600))
	require.ErrorContains(t, run([]string{"--config", file}), `"from-file"`, "the file sets a flag")
	t.Setenv("IDEMGATE_LOG_LEVEL", "from-env")
	require.ErrorContains(t, run([]string{"--config", file}), `"from-env"`, "the environment wins over the file")
	require.ErrorContains(t, run([]string{"--config", file, "--log-level", "from-flag"}), `"from-flag"`, "the command line wins over both")

	t.Setenv("IDEMGATE_CONFIG", file)
	require.NoError(t, os.Unsetenv("IDEMGATE_LOG_LEVEL")) // t.Setenv above restores it
	require.NoError(t, os.WriteFile(file, []byte("log-level: info\nlog-levle: warn\n"), 0o600))
	require.ErrorContains(t, run(nil), `mcp.yaml:2: unknown setting "log-levle"`, "IDEMGATE_CONFIG names the file")
}
