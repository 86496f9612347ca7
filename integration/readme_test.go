package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readmeSession is the marker of the README's curl session.
const readmeSession = "<!-- curl session: run by integration/readme_test.go -->"

// readmeStep is one "$ command" of a console block and the output shown
// under it.
type readmeStep struct {
	command string
	want    []string
}

// readmeSteps reads the console block after marker in the README.
func readmeSteps(t *testing.T, marker string) []readmeStep {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(data), marker+"\n```console\n")
	require.True(t, ok, "no console block after %q in README.md", marker)
	block, _, ok := strings.Cut(rest, "\n```")
	require.True(t, ok, "the console block does not end")
	var steps []readmeStep
	for _, line := range strings.Split(block, "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, readmeStep{command: cmd})
			continue
		}
		require.NotEmpty(t, steps, "output before the first command: %q", line)
		steps[len(steps)-1].want = append(steps[len(steps)-1].want, line)
	}
	return steps
}

// matches reports whether the lines shown appear in got in order, "…"
// standing for any text (a line of only "…" for any lines).
func matches(shown, got []string) error {
	i := 0
	for _, w := range shown {
		if w == "…" {
			continue
		}
		re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(w), "…", ".*") + "$")
		for i < len(got) && !re.MatchString(got[i]) {
			i++
		}
		if i == len(got) {
			return fmt.Errorf("the README shows %q, which the output lacks", w)
		}
		i++
	}
	return nil
}

// The README's curl session, run as written against a real front door
// (through the OpenAPI-checking proxy) with the demo tools: every command
// succeeds and prints what the README shows.
func TestReadmeCurlSession(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("curl is not installed (set CI=1 to make this a failure)")
		}
		t.Fatal("curl is not installed, and CI is set")
	}
	steps := readmeSteps(t, readmeSession)
	require.GreaterOrEqual(t, len(steps), 4)
	e := newHTTPEnv(t)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "agent.token"), []byte(e.gw.tokens[agentA]+"\n"), 0o600))

	// One shell runs the session, so that a variable set by one command
	// serves the next; a marker line separates the outputs.
	var script strings.Builder
	script.WriteString("set -e\n")
	for i, s := range steps {
		cmd := strings.ReplaceAll(s.command, "http://127.0.0.1:8080", e.gw.url)
		fmt.Fprintf(&script, "echo '@@step %d'\n%s\necho\n", i, cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "sh", "-c", script.String())
	sh.Dir = dir
	out, err := sh.CombinedOutput()
	require.NoError(t, err, "the README session fails:\n%s", out)

	outputs := strings.Split(strings.ReplaceAll(string(out), "\r", ""), "@@step ")
	require.Len(t, outputs, len(steps)+1, "%s", out)
	for i, s := range steps {
		got := strings.Split(outputs[i+1], "\n")[1:]
		require.NoError(t, matches(s.want, got), "$ %s\n%s", s.command, outputs[i+1])
	}
	require.Equal(t, 1, e.sink.count(), "the session fired one email")
}
