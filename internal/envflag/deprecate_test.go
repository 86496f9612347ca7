package envflag

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deprecatedSet is a flag set with --nats-tls-ca and its old name --tls-ca,
// writing its warnings to the returned buffer.
func deprecatedSet(t *testing.T) (*flag.FlagSet, *string, *bytes.Buffer) {
	t.Helper()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	ca := fs.String("nats-tls-ca", "", "CA file")
	Deprecate(fs, "tls-ca", "nats-tls-ca")
	return fs, ca, &out
}

func TestDeprecatedNameSetsTheNewFlagAndWarnsOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		want    string
		warning string // "" for none
	}{
		{"old on the command line", []string{"--tls-ca", "old.pem"}, nil, "", "old.pem", "--tls-ca is deprecated and goes in the next release: use --nats-tls-ca"},
		{"new on the command line", []string{"--nats-tls-ca", "new.pem"}, nil, "", "new.pem", ""},
		{"both on the command line: the last wins, as for a repeated flag", []string{"--tls-ca", "old.pem", "--nats-tls-ca", "new.pem"}, nil, "", "new.pem", "use --nats-tls-ca"},
		{"old variable", nil, map[string]string{"TEST_TLS_CA": "old.pem"}, "", "old.pem", "TEST_TLS_CA is deprecated and goes in the next release: use TEST_NATS_TLS_CA"},
		{"new variable wins over the old", nil, map[string]string{"TEST_TLS_CA": "old.pem", "TEST_NATS_TLS_CA": "new.pem"}, "", "new.pem", "use TEST_NATS_TLS_CA"},
		{"the command line wins over an old variable", []string{"--nats-tls-ca", "new.pem"}, map[string]string{"TEST_TLS_CA": "old.pem"}, "", "new.pem", ""},
		{"an old name on the command line wins over the new variable", []string{"--tls-ca", "old.pem"}, map[string]string{"TEST_NATS_TLS_CA": "new.pem"}, "", "old.pem", "use --nats-tls-ca"},
		{"old name in the file", nil, nil, "tls_ca: old.pem\n", "old.pem", "x.yaml:1: tls_ca is deprecated and goes in the next release: use nats-tls-ca"},
		{"new name in the file wins over the old", nil, nil, "tls-ca: old.pem\nnats-tls-ca: new.pem\n", "new.pem", "x.yaml:1: tls-ca is deprecated"},
		{"the environment wins over an old name in the file", nil, map[string]string{"TEST_NATS_TLS_CA": "env.pem"}, "tls-ca: old.pem\n", "env.pem", "tls-ca is deprecated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs, ca, out := deprecatedSet(t)
			require.NoError(t, fs.Parse(tc.args))
			require.NoError(t, Apply(fs, "TEST", nil))
			if tc.file != "" {
				file := t.TempDir() + "/x.yaml"
				require.NoError(t, os.WriteFile(file, []byte(tc.file), 0o644))
				require.NoError(t, ApplyFile(fs, file))
			}
			require.Equal(t, tc.want, *ca)
			if tc.warning == "" {
				require.Empty(t, out.String())
				return
			}
			require.Contains(t, out.String(), tc.warning)
			require.Equal(t, 1, strings.Count(out.String(), "warning:"), "one warning: %s", out.String())
		})
	}
}

func TestDeprecatedNameOfACommandLineOnlyFlagIgnoresTheEnvironment(t *testing.T) {
	t.Setenv("TEST_FORCE", "true")
	t.Setenv("TEST_YES_REALLY", "true")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	force := fs.Bool("yes-really", false, "")
	Deprecate(fs, "force", "yes-really")
	require.NoError(t, fs.Parse(nil))
	require.NoError(t, Apply(fs, "TEST", nil, "yes-really"))
	require.False(t, *force, "neither name is taken from the environment")

	require.NoError(t, fs.Parse([]string{"--force"}))
	require.True(t, *force, "the old name of a boolean flag stands alone")
}

func TestDeprecatedNameIsListedAsDeprecated(t *testing.T) {
	fs, _, out := deprecatedSet(t)
	fs.PrintDefaults()
	require.Contains(t, out.String(), "-tls-ca value\n    \tdeprecated, removed in the next release: use --nats-tls-ca")
	name, ok := Deprecated(fs.Lookup("tls-ca"))
	require.True(t, ok)
	require.Equal(t, "nats-tls-ca", name)
	_, ok = Deprecated(fs.Lookup("nats-tls-ca"))
	require.False(t, ok)
}
