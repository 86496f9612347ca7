package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sharedFlags are the connection and log flags every binary that talks to
// NATS takes, under these names.
var sharedFlags = []string{
	"nats-url", "nats-name", "nats-timeout", "nats-creds", "nats-nkey", "nats-user",
	"nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-inbox-prefix",
	"log-level", "log-format",
}

// helpFlags runs a binary's --help and returns each flag it lists with its
// usage text, the "(default ...)" left off (the defaults are the binary's
// own: its connection name, submit's shorter wait for people).
func helpFlags(t *testing.T, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(bin(args[0]), args[1:]...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%v --help exits 0:\n%s", args, out)
	flags := map[string]string{}
	head := regexp.MustCompile(`^  -([a-z0-9-]+)( \w+)?$`)
	name := ""
	for _, line := range strings.Split(string(out), "\n") {
		if m := head.FindStringSubmatch(line); m != nil {
			name = m[1]
			flags[name] = ""
			continue
		}
		if name != "" && strings.HasPrefix(line, "    \t") {
			usage := strings.TrimPrefix(line, "    \t")
			if i := strings.LastIndex(usage, " (default "); i >= 0 {
				usage = usage[:i]
			}
			flags[name] = strings.TrimSpace(flags[name] + " " + usage)
		}
	}
	require.NotEmpty(t, flags, "%v --help lists flags:\n%s", args, out)
	return flags
}

// Every binary that connects to NATS takes the same connection and log
// flags, with the same usage, and lists the old names of earlier releases as
// deprecated, naming the flag to use instead.
func TestEveryBinaryTakesTheSameConnectionAndLogFlags(t *testing.T) {
	t.Parallel()
	binaries := []struct {
		args    []string
		oldTLS  bool // took --tls-ca, --tls-cert, --tls-key for NATS
		natsURL string
	}{
		{[]string{"gateway", "--help"}, false, "NATS server(s), comma separated (env NATS_URL)"},
		{[]string{"mcp", "--help"}, true, "NATS server(s), comma separated (env NATS_URL)"},
		{[]string{"submit", "get", "--help"}, true, "NATS server(s), comma separated (env NATS_URL)"},
		{[]string{"worker", "--help"}, true, "NATS server(s), comma separated; empty runs an embedded JetStream (env NATS_URL)"},
	}
	var first map[string]string
	for _, b := range binaries {
		flags := helpFlags(t, b.args...)
		require.Equal(t, b.natsURL, flags["nats-url"], b.args[0])
		if first == nil {
			first = flags
		}
		for _, name := range sharedFlags {
			require.Contains(t, flags, name, "%s --%s", b.args[0], name)
			require.NotEmpty(t, flags[name])
			if name != "nats-url" {
				require.Equal(t, first[name], flags[name], "%s --%s has the usage the gateway's has", b.args[0], name)
			}
		}
		require.NotEmpty(t, flags["config"], "%s --config", b.args[0])
		require.Equal(t, first["config"], flags["config"], "%s --config has the usage the gateway's has", b.args[0])
		old := map[string]string{"creds": "nats-creds", "nkey": "nats-nkey", "inbox-prefix": "nats-inbox-prefix"}
		if b.oldTLS {
			old["tls-ca"], old["tls-cert"], old["tls-key"] = "nats-tls-ca", "nats-tls-cert", "nats-tls-key"
		}
		for o, n := range old {
			require.Equal(t, "deprecated, removed in the next release: use --"+n, flags[o], "%s --%s", b.args[0], o)
		}
		if !b.oldTLS {
			require.NotContains(t, flags["tls-cert"], "deprecated", "the gateway's --tls-cert serves HTTPS")
		}
	}
}

// The connection flags' old names still work for one release, from each
// source a setting comes from — the command line (the worker), the
// environment (submit) and a config file (the gateway) — and each prints one
// warning naming the flag to use instead; so do the gateway's variables of
// earlier releases (IDEMGATE_GATEWAY_<FLAG>).
func TestOldConnectionFlagNamesStillWorkAndWarn(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")

	tools := writeTools(t, "tools:\n  echo:\n    effect: noop\n    key_args: all\n")
	w := launchWorker(t, "worker", []string{"--tools", tools, "--holder", "worker", "--nats-url", s.url,
		"--tls-ca", s.ca.certPEM, "--nats-user", "worker", "--inbox-prefix", "_INBOX.worker"},
		[]string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, "worker")})
	w.waitLog(t, "worker consuming", 20*time.Second)
	for _, old := range []string{"tls-ca", "inbox-prefix"} {
		warning := fmt.Sprintf("warning: --%s is deprecated and goes in the next release: use --nats-%s", old, old)
		require.Equal(t, 1, strings.Count(w.log.String(), warning), "one warning for --%s:\n%s", old, w.log.String())
	}

	cmd := exec.Command(bin("submit"), "--tool", "echo", "--args", `{"via":"old names"}`, "--nats-url", s.url, "--nats-user", "agent-1", "--wait", "20s")
	cmd.Env = append(os.Environ(), "IDEMGATE_NATS_PASSWORD="+s.password(t, "agent-1"),
		"IDEMGATE_TLS_CA="+s.ca.certPEM, "IDEMGATE_INBOX_PREFIX=_INBOX.agent-1")
	sub := runClient(t, cmd)
	require.Equal(t, 0, sub.code, sub.stderr)
	for _, old := range []string{"TLS_CA", "INBOX_PREFIX"} {
		warning := fmt.Sprintf("warning: IDEMGATE_%s is deprecated and goes in the next release: use IDEMGATE_NATS_%s", old, old)
		require.Equal(t, 1, strings.Count(sub.stderr, warning), sub.stderr)
	}

	config := filepath.Join(t.TempDir(), "gateway.yaml")
	require.NoError(t, os.WriteFile(config, []byte("inbox_prefix: _INBOX.gateway\n"), 0o600))
	g := startGatewayEnv(t, []string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, "gateway"), "IDEMGATE_GATEWAY_MAX_WAIT=4m"},
		"--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", "gateway", "--config", config)
	res := g.call(t, agentA, "echo", `{"via":"old names"}`)
	require.Equal(t, http.StatusOK, res.status, res.raw)
	require.Equal(t, 1, strings.Count(g.proc.log.String(), "gateway.yaml:1: inbox_prefix is deprecated and goes in the next release: use nats-inbox-prefix"), g.proc.log.String())
	require.Equal(t, 1, strings.Count(g.proc.log.String(), "warning: IDEMGATE_GATEWAY_MAX_WAIT is deprecated and goes in the next release: use IDEMGATE_MAX_WAIT"),
		"the gateway's variables of earlier releases still work:\n%s", g.proc.log.String())
	require.Empty(t, s.violations(), "with the old names every process used its own inbox")
}
