package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// makeRun is one `make run` in the repository, in its own process group.
type makeRun struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startMakeRun runs make run with vars (NAME=value) and a private BIN, so
// that it neither writes the repository's bin/ nor replaces binaries other
// tests are running. It is stopped (SIGTERM to its group) when the test ends.
func startMakeRun(t *testing.T, bin string, vars ...string) *makeRun {
	t.Helper()
	// Every port make run listens on is a free one unless vars names it:
	// tests run make run in parallel, and beside a make run on the defaults.
	for _, port := range []string{"NATS_PORT", "SINK_PORT", "GATEWAY_PORT", "MCP_PORT", "ADMIN_PORT"} {
		if !slices.ContainsFunc(vars, func(v string) bool { return strings.HasPrefix(v, port+"=") }) {
			vars = append(vars, fmt.Sprintf("%s=%d", port, freePort(t)))
		}
	}
	cmd := exec.Command("make", append([]string{"--no-print-directory", "run", "BIN=" + bin}, vars...)...)
	cmd.Dir = ".."
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r := &makeRun{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
		if t.Failed() {
			t.Logf("make run %v:\n%s", vars, r.out.String())
		}
	})
	return r
}

// exited waits for make run to end and returns its output. It waits as long
// as the test may run: make run builds every binary first, which on a loaded
// machine takes minutes.
func (r *makeRun) exited(t *testing.T) string {
	t.Helper()
	select {
	case <-r.done:
		return r.out.String()
	case <-testEnds(t):
		t.Fatalf("make run still running at the test's deadline:\n%s", r.out.String())
		return ""
	}
}

// says waits until make run's output contains want, as long as the test may
// run, and fails at once if make run ends first.
func (r *makeRun) says(t *testing.T, want string) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(r.out.String(), want) {
		select {
		case <-r.done:
			t.Fatalf("make run ended before saying %q:\n%s", want, r.out.String())
		case <-testEnds(t):
			t.Fatalf("make run did not say %q by the test's deadline:\n%s", want, r.out.String())
		case <-tick.C:
		}
	}
}

// testEnds fires 30 s before the test binary's -timeout (leaving time for
// the cleanups to report), or never when there is none.
func testEnds(t *testing.T) <-chan time.Time {
	d, ok := t.Deadline()
	if !ok {
		return nil
	}
	return time.After(time.Until(d) - 30*time.Second)
}

// make run serves the demo on the ports it is given; a second one on a
// taken port, or on the first one's store, fails at once and says which;
// the sink says "listening" only once it listens.
func TestMakeRun(t *testing.T) {
	skipShort(t, "make run (it builds every binary)")
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	bin := t.TempDir()
	data := t.TempDir()
	natsPort, sinkPort := freePort(t), freePort(t)
	first := startMakeRun(t, bin, fmt.Sprintf("NATS_PORT=%d", natsPort), fmt.Sprintf("SINK_PORT=%d", sinkPort), "DATA="+data)
	first.says(t, "worker consuming")
	require.Contains(t, first.out.String(), fmt.Sprintf("sink listening on http://127.0.0.1:%d", sinkPort))

	url := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	s := submit(t, url, "--tool", "create_ticket", "--args", `{"title":"Disk full","requested_at":"2026-11-30T09:00:00Z"}`, "--wait", "30s")
	require.Equal(t, 0, s.code, "the demo tool fires through the sink on SINK_PORT: %s %s", s.stdout, s.stderr)
	sinkLog, err := os.ReadFile(filepath.Join(data, fmt.Sprintf("sink-%d.jsonl", sinkPort)))
	require.NoError(t, err)
	require.Contains(t, string(sinkLog), s.res.Key, "the sink logged the request with its key")

	// The same NATS port: the worker fails at once, naming the address.
	otherSink := freePort(t)
	start := time.Now()
	out := startMakeRun(t, bin, fmt.Sprintf("NATS_PORT=%d", natsPort), fmt.Sprintf("SINK_PORT=%d", otherSink), "DATA="+t.TempDir()).exited(t)
	require.Contains(t, out, fmt.Sprintf("address in use: 127.0.0.1:%d", natsPort), out)
	require.Contains(t, out, "NATS_PORT=")
	require.NotContains(t, out, "not ready within")
	t.Logf("a taken NATS port failed after %s", time.Since(start).Round(time.Millisecond))

	// The same sink port: the sink fails at once and never says listening.
	out = startMakeRun(t, bin, fmt.Sprintf("NATS_PORT=%d", freePort(t)), fmt.Sprintf("SINK_PORT=%d", sinkPort), "DATA="+t.TempDir()).exited(t)
	require.Contains(t, out, fmt.Sprintf("listen tcp 127.0.0.1:%d: bind: address already in use", sinkPort), out)
	require.Contains(t, out, "SINK_PORT=")
	require.NotContains(t, out, "sink listening", "the second sink never listened")
	require.NotContains(t, out, "embedded JetStream", "no worker starts without its sink")

	// Free ports, the first one's store: refused, naming the holder.
	out = startMakeRun(t, bin, fmt.Sprintf("NATS_PORT=%d", freePort(t)), fmt.Sprintf("SINK_PORT=%d", freePort(t)),
		"DATA="+t.TempDir(), "STORE_DIR="+filepath.Join(data, fmt.Sprintf("jetstream-%d", natsPort))).exited(t)
	require.Contains(t, out, "store dir in use", out)
	require.Contains(t, out, "--store-dir")

	// The first goes on serving.
	again := submit(t, url, "--tool", "create_ticket", "--args", `{"title":"Disk full","requested_at":"2026-11-30T09:05:00Z"}`, "--wait", "30s")
	require.Equal(t, 3, again.code, again.stdout+again.stderr)
}

// Two workers on one --store-dir: the second is refused with a clear
// message and exit 1, and the first keeps its store.
func TestWorkerStoreDirLock(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	tools := writeTools(t, "tools:\n  echo: {effect: noop, key_args: all}\n")
	first := launchWorker(t, "w1", []string{"--tools", tools, "--store-dir", store, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, nil)
	first.waitLog(t, "worker consuming", 30*time.Second)
	second := launchWorker(t, "w2", []string{"--tools", tools, "--store-dir", store, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, nil)
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the second worker on the store still runs:\n%s", second.log.String())
	}
	var ee *exec.ExitError
	require.ErrorAs(t, second.err, &ee)
	require.Equal(t, 1, ee.ExitCode())
	require.Contains(t, second.log.String(), "store dir in use: "+store)
	require.Contains(t, second.log.String(), fmt.Sprintf("process %d", first.cmd.Process.Pid))
	require.NotContains(t, second.log.String(), "worker consuming")
}

// worker --help prints the usage with examples and exit statuses, to
// stdout, and exits 0.
func TestWorkerHelp(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin("worker"), "--help")
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), errb.String())
	require.Contains(t, out.String(), "usage: worker [flags]")
	require.Contains(t, out.String(), "Examples:")
	require.Contains(t, out.String(), "Exit status:")
	require.Contains(t, out.String(), "-store-dir")
	require.NotContains(t, errb.String(), "help requested")
}

// worker --check-config warns (and still passes) about a webhook to an
// address it would refuse, and about key args that look like timestamps or
// attempt counters; the demo tools file has no warnings.
func TestCheckConfigWarnings(t *testing.T) {
	t.Parallel()
	check := func(tools string, extra ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, bin("worker"), append([]string{"--check-config", "--tools", tools}, extra...)...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &ee, out.String())
			code = ee.ExitCode()
		}
		return out.String(), code
	}
	out, code := check("../deployments/demo/tools.yaml")
	require.Equal(t, 0, code, out)
	require.NotContains(t, out, "warning")
	require.Contains(t, out, "tools, ok")

	tools := writeTools(t, `tools:
  create_ticket:
    effect: webhook
    key_args: [title, requested_at]
    webhook: {url: "http://127.0.0.1:8787/tickets"}
`)
	out, code = check(tools)
	require.Equal(t, 0, code, "warnings are not errors: %s", out)
	require.Contains(t, out, `tools.yaml:4: create_ticket.key_args[1]: "requested_at" looks like a timestamp`)
	require.Contains(t, out, `tools.yaml:5: create_ticket.webhook.url: http://127.0.0.1:8787/tickets names 127.0.0.1, a loopback address`)
	require.Contains(t, out, "1 tools, ok (2 warnings)")

	out, code = check(tools, "--webhook-allow", "127.0.0.0/8")
	require.Equal(t, 0, code, out)
	require.NotContains(t, out, "loopback", "--webhook-allow covers the address")

	// The worker logs them at start too.
	url := jetStream(t)
	w := startWorker(t, "w1", url, tools)
	require.Contains(t, w.log.String(), "requested_at")
}
