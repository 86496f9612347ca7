package envflag

import (
	"bytes"
	"flag"
	"os"
	"strings"
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

func TestConfigFileIsLastBeforeDefaults(t *testing.T) {
	t.Setenv("TEST_ACK_WAIT", "7s")
	file := t.TempDir() + "/worker.yaml"
	require.NoError(t, os.WriteFile(file, []byte("ack_wait: 9s\nconcurrency: 5\nmax-deliver: 4\nallow: [10.0.0.0/8, 127.0.0.1/32]\n"), 0o644))
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	ackWait := fs.Duration("ack-wait", time.Second, "")
	conc := fs.Int("concurrency", 1, "")
	maxDeliver := fs.Int("max-deliver", 10, "")
	allow := fs.String("allow", "", "")
	untouched := fs.Int("untouched", 42, "")
	require.NoError(t, fs.Parse([]string{"--concurrency", "3"}))
	require.NoError(t, Apply(fs, "TEST", nil))
	require.NoError(t, ApplyFile(fs, file))
	require.Equal(t, 3, *conc, "the command line wins over the file")
	require.Equal(t, 7*time.Second, *ackWait, "the environment wins over the file")
	require.Equal(t, 4, *maxDeliver, "the file wins over the default")
	require.Equal(t, "10.0.0.0/8,127.0.0.1/32", *allow, "a list is comma-separated")
	require.Equal(t, 42, *untouched)
}

func TestConfigFileErrorsHaveLines(t *testing.T) {
	file := t.TempDir() + "/worker.yaml"
	require.NoError(t, os.WriteFile(file, []byte("concurrency: 5\nack-wiat: 1s\nmax-deliver: lots\n"), 0o644))
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Int("concurrency", 1, "")
	fs.Duration("ack-wait", time.Second, "")
	fs.Int("max-deliver", 10, "")
	require.NoError(t, fs.Parse(nil))
	err := ApplyFile(fs, file)
	require.ErrorContains(t, err, `worker.yaml:2: unknown setting "ack-wiat"`)
	require.ErrorContains(t, err, `worker.yaml:3: max-deliver: "lots"`)
}

func TestCommandLineOnlyFlagsIgnoreTheEnvironment(t *testing.T) {
	t.Setenv("TEST_FORCE", "true")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	force := fs.Bool("force", false, "")
	require.NoError(t, fs.Parse(nil))
	require.NoError(t, Apply(fs, "TEST", nil, "force"))
	require.False(t, *force, "a confirming flag left in the environment confirms nothing")

	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	force = fs.Bool("force", false, "")
	require.NoError(t, fs.Parse([]string{"--force"}))
	require.NoError(t, Apply(fs, "TEST", nil, "force"))
	require.True(t, *force, "the command line still sets it")
}

func TestOldPrefixIsReadWithAWarning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		warning string // "" for none
	}{
		{"old prefix", nil, map[string]string{"OLD_X_NATS_URL": "nats://old:4222"}, "nats://old:4222", "OLD_X_NATS_URL is deprecated and goes in the next release: use NEW_NATS_URL"},
		{"new prefix wins over the old", nil, map[string]string{"OLD_X_NATS_URL": "nats://old:4222", "NEW_NATS_URL": "nats://new:4222"}, "nats://new:4222", "use NEW_NATS_URL"},
		{"old prefix wins over the alias", nil, map[string]string{"OLD_X_NATS_URL": "nats://old:4222", "NATS_URL": "nats://alias:4222"}, "nats://old:4222", "use NEW_NATS_URL"},
		{"old prefix of a deprecated name", nil, map[string]string{"OLD_X_URL": "nats://older:4222"}, "nats://older:4222", "OLD_X_URL is deprecated and goes in the next release: use NEW_NATS_URL"},
		{"the command line wins", []string{"--nats-url", "nats://flag:4222"}, map[string]string{"OLD_X_NATS_URL": "nats://old:4222"}, "nats://flag:4222", ""},
		{"new prefix alone", nil, map[string]string{"NEW_NATS_URL": "nats://new:4222"}, "nats://new:4222", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			var out bytes.Buffer
			fs.SetOutput(&out)
			url := fs.String("nats-url", "", "")
			Deprecate(fs, "url", "nats-url")
			force := fs.Bool("force", false, "")
			t.Setenv("OLD_X_FORCE", "true")
			require.NoError(t, fs.Parse(tc.args))
			require.NoError(t, apply(fs, "NEW", "OLD_X", map[string]string{"nats-url": "NATS_URL"}, []string{"force"}))
			require.Equal(t, tc.want, *url)
			require.False(t, *force, "a command-line-only flag ignores the old prefix too")
			if tc.warning == "" {
				require.Empty(t, out.String())
				return
			}
			require.Contains(t, out.String(), tc.warning)
			require.Equal(t, 1, strings.Count(out.String(), "warning:"), "one warning: %s", out.String())
		})
	}
}

func TestCommandLineOnlyFlagsAreErrorsInTheFile(t *testing.T) {
	file := t.TempDir() + "/submit.yaml"
	require.NoError(t, os.WriteFile(file, []byte("wait: 5s\nforce: true\n"), 0o644))
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	force := fs.Bool("force", false, "")
	wait := fs.Duration("wait", time.Second, "")
	require.NoError(t, fs.Parse(nil))
	require.ErrorContains(t, ApplyFile(fs, file, "force"), "submit.yaml:2: force is for the command line only")
	require.False(t, *force, "a confirming flag in a file confirms nothing")
	require.Equal(t, 5*time.Second, *wait)
}

// Load reads the environment, then the file --config names (itself given
// by IDEMGATE_CONFIG here), under the command line; a command-line-only
// flag the file sets is an error.
func TestLoadReadsTheEnvironmentThenTheConfigFile(t *testing.T) {
	file := t.TempDir() + "/gateway.yaml"
	require.NoError(t, os.WriteFile(file, []byte("ack-wait: 9s\nconcurrency: 5\nmax-deliver: 4\n"), 0o644))
	t.Setenv("IDEMGATE_CONFIG", file)
	t.Setenv("IDEMGATE_ACK_WAIT", "7s")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	config := fs.String("config", "", ConfigUsage)
	ackWait := fs.Duration("ack-wait", time.Second, "")
	conc := fs.Int("concurrency", 1, "")
	maxDeliver := fs.Int("max-deliver", 10, "")
	require.NoError(t, fs.Parse([]string{"--concurrency", "3"}))
	require.NoError(t, Load(fs, config, Sources{}))
	require.Equal(t, 3, *conc, "the command line wins")
	require.Equal(t, 7*time.Second, *ackWait, "then the environment")
	require.Equal(t, 4, *maxDeliver, "then the file")

	fs2 := flag.NewFlagSet("y", flag.ContinueOnError)
	config2 := fs2.String("config", "", ConfigUsage)
	fs2.Int("concurrency", 1, "")
	require.NoError(t, fs2.Parse(nil))
	require.ErrorContains(t, Load(fs2, config2, Sources{CommandLineOnly: []string{"concurrency"}}), "concurrency")
}
