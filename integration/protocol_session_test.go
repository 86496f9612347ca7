package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// natsCLIVersion is the official nats CLI the protocol's worked session is
// checked with (a version the Go module proxy serves).
const natsCLIVersion = "v0.5.1"

var natsCLIBuild struct {
	once sync.Once
	dir  string
	err  error
}

// natsCLI returns the directory holding the nats CLI, installing it with go
// install on first use (into the user cache, so later runs reuse it). Without
// the module proxy it skips — unless CI is set, where it fails.
func natsCLI(t *testing.T) string {
	t.Helper()
	natsCLIBuild.once.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		dir := filepath.Join(cache, "idemgate-test", "natscli-"+natsCLIVersion)
		natsCLIBuild.dir = dir
		if _, err := os.Stat(filepath.Join(dir, "nats")); err == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "install", "github.com/nats-io/natscli/nats@"+natsCLIVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			natsCLIBuild.err = fmt.Errorf("go install nats@%s: %w\n%s", natsCLIVersion, err, out.String())
			return
		}
		t.Logf("installed the nats CLI %s in %s", natsCLIVersion, time.Since(start).Round(time.Second))
	})
	if natsCLIBuild.err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("the nats CLI could not be installed (set CI=1 to make this a failure): %v", natsCLIBuild.err)
		}
		t.Fatalf("the nats CLI could not be installed, and CI is set: %v", natsCLIBuild.err)
	}
	return natsCLIBuild.dir
}

// sessionStep is one command of the worked session and the output the doc
// shows for it.
type sessionStep struct {
	command string
	output  []string
}

// docSession reads the worked session of docs/protocol.md: every console
// block between <!-- begin session --> and <!-- end session -->, in order.
// A line starting with "$ " is a command (a line ending in "\" continues on
// the next); the lines after it are its output.
func docSession(t *testing.T) []sessionStep {
	t.Helper()
	doc, err := os.ReadFile("../docs/protocol.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)<!-- begin session -->\n```console\n(.*?)```\n<!-- end session -->").FindAllSubmatch(doc, -1)
	require.NotEmpty(t, blocks, "docs/protocol.md has a worked session")
	var steps []sessionStep
	for _, b := range blocks {
		ls := strings.Split(strings.TrimRight(string(b[1]), "\n"), "\n")
		for i := 0; i < len(ls); i++ {
			l := ls[i]
			if cmd, ok := strings.CutPrefix(l, "$ "); ok {
				for strings.HasSuffix(cmd, "\\") && i+1 < len(ls) {
					i++
					cmd += "\n" + ls[i]
				}
				steps = append(steps, sessionStep{command: cmd})
				continue
			}
			require.NotEmpty(t, steps, "output before the first command: %q", l)
			steps[len(steps)-1].output = append(steps[len(steps)-1].output, l)
		}
	}
	return steps
}

// lineMatches reports whether got matches want, in which "…" stands for any
// text.
func lineMatches(want, got string) bool {
	parts := strings.Split(want, "…")
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(quoted, ".*") + "$").MatchString(got)
}

// The worked session of docs/protocol.md, run command by command with the
// official nats CLI against a real worker (the demo tools, the demo sink):
// each command succeeds and prints what the doc shows, in order.
func TestProtocolSessionWithNatsCLI(t *testing.T) {
	t.Parallel()
	natsDir := natsCLI(t)
	steps := docSession(t)

	sinkPort := freePort(t)
	sinkCmd := exec.Command(bin("sink"), "--listen", fmt.Sprintf("127.0.0.1:%d", sinkPort), "--log", filepath.Join(t.TempDir(), "sink.jsonl"),
		"--ready-file", filepath.Join(t.TempDir(), "ready"))
	require.NoError(t, sinkCmd.Start())
	t.Cleanup(func() { _ = sinkCmd.Process.Kill(); _ = sinkCmd.Wait() })
	url := jetStream(t)
	startWorker(t, "w1", url, demoTools(t, fmt.Sprintf("http://127.0.0.1:%d", sinkPort)))

	work := t.TempDir()
	require.NoError(t, os.Symlink(binDir, filepath.Join(work, "bin")))
	var script strings.Builder
	script.WriteString("set -eu -o pipefail\nexec 2>&1\n")
	for i, s := range steps {
		cmd := strings.ReplaceAll(s.command, "nats://127.0.0.1:4222", url)
		fmt.Fprintf(&script, "echo '@@@ %d'\n%s\n", i, cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PATH="+natsDir+string(os.PathListSeparator)+os.Getenv("PATH"), "NATS_CONTEXT=", "HOME="+work)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the session stops:\n%s", out)

	got := map[int][]string{}
	cur := -1
	for _, l := range strings.Split(string(out), "\n") {
		var n int
		if _, err := fmt.Sscanf(l, "@@@ %d", &n); err == nil && strings.HasPrefix(l, "@@@ ") {
			cur = n
			continue
		}
		if cur >= 0 && strings.TrimSpace(l) != "" {
			got[cur] = append(got[cur], strings.TrimRight(l, " "))
		}
	}
	for i, s := range steps {
		lines := got[i]
		j := 0
		for _, want := range s.output {
			for j < len(lines) && !lineMatches(want, lines[j]) {
				j++
			}
			require.Less(t, j, len(lines), "$ %s\nprints no line like\n  %s\nafter the ones before; it printed:\n  %s",
				s.command, want, strings.Join(got[i], "\n  "))
			j++
		}
	}
}
