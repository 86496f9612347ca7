package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/intent"
)

// binDir holds the binaries built once for every test of the package.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemgate-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/...")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	stopBrowser()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// skipShort skips a slow test (what it runs) under go test -short, the
// edit-test loop's make test-short; make test runs it.
func skipShort(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: skipping %s (make test runs it)", what)
	}
}

// jetStream starts a JetStream server in the test process (the workers are
// separate processes and connect to it over TCP) and returns its URL.
func jetStream(t *testing.T) string {
	t.Helper()
	srv := natstest.RunServer(t)
	url := srv.ClientURL()
	servers.Store(url, srv)
	t.Cleanup(func() { servers.Delete(url) })
	return url
}

// servers are the servers jetStream started, by client URL.
var servers sync.Map

// subscriptions counts the subscriptions on exactly subject of every
// connection to url's server (one jetStream started): a ledger watch
// subscribes to its key's subject.
func subscriptions(t *testing.T, url, subject string) int {
	t.Helper()
	v, ok := servers.Load(url)
	require.True(t, ok, "no server of jetStream at %s", url)
	connz, err := v.(*server.Server).Connz(&server.ConnzOptions{Subscriptions: true})
	require.NoError(t, err)
	n := 0
	for _, c := range connz.Conns {
		for _, s := range c.Subs {
			if s == subject {
				n++
			}
		}
	}
	return n
}

// writeTools writes a tools file and returns its path.
func writeTools(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tools.yaml")
	require.NoError(t, os.WriteFile(p, []byte(yaml), 0o644))
	return p
}

// proc is a running worker process.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

// startWorker runs the worker binary against url and waits until it consumes.
func startWorker(t *testing.T, name, url, tools string, extra ...string) *proc {
	t.Helper()
	// The test downstreams listen on loopback, which webhooks refuse unless
	// allowed.
	args := []string{"--tools", tools, "--holder", name, "--log-level", "debug", "--webhook-allow", "127.0.0.0/8"}
	if url != "" {
		args = append(args, "--nats-url", url)
	}
	p := launchWorker(t, name, append(args, extra...), nil)
	p.waitLog(t, "worker consuming", 20*time.Second)
	return p
}

// launchWorker starts the worker binary with args (and env added to the
// environment); it is killed, and its log shown on failure, when the test
// ends.
func launchWorker(t *testing.T, name string, args, env []string) *proc {
	t.Helper()
	return launchProc(t, "worker", name, args, env)
}

// launchProc starts binary with args (and env added to the environment);
// it is killed, and its log shown on failure, when the test ends.
func launchProc(t *testing.T, binary, name string, args, env []string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: exec.Command(bin(binary), args...), log: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s %s log:\n%s", binary, name, p.log.String())
		}
	})
	return p
}

// waitLog waits until the process has logged text; it fails the test if the
// process exits first. A live process that has not logged it yet is waited
// for as long as the test may run (a loaded machine may take minutes to
// start one that takes a second when idle): stall only says so in the test's
// log, every stall, so that a wait that never ends shows what it waits for.
func (p *proc) waitLog(t *testing.T, text string, stall time.Duration) {
	t.Helper()
	start, reported := time.Now(), time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(p.log.String(), text) {
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.log.String())
		case <-t.Context().Done():
			t.Fatalf("%s did not log %q before the test ended", p.name, text)
		case <-tick.C:
		}
		if time.Since(reported) >= stall {
			reported = time.Now()
			t.Logf("%s has not logged %q after %s; still waiting", p.name, text, time.Since(start).Round(time.Second))
		}
	}
}

// until polls cond until it holds, as long as the test may run: for a
// state the system reaches by itself, whatever the machine's load.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-t.Context().Done():
			t.Fatalf("never happened: %s", what)
		case <-tick.C:
		}
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM and waits up to d for the process to exit.
func (p *proc) terminate(d time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		return errors.New("worker did not exit after SIGTERM")
	}
}

// syncBuffer is a bytes.Buffer safe for a process writing and a test reading.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// submitted is what one run of the submit binary did.
type submitted struct {
	code   int
	stdout string
	stderr string
	res    intent.Result
}

// submit runs the submit binary and decodes its answer.
func submit(t *testing.T, url string, args ...string) submitted {
	t.Helper()
	// A subcommand and its words come first (submit dlq replay 7), then flags.
	n := 0
	for n < len(args) && !strings.HasPrefix(args[n], "-") {
		n++
	}
	full := append(append(append([]string{}, args[:n]...), "--nats-url", url), args[n:]...)
	return runClient(t, exec.Command(bin("submit"), full...))
}

// runClient runs a client command line (submit, or another language's) and
// collects its exit code, output and the answer it printed, if any.
func runClient(t *testing.T, cmd *exec.Cmd) submitted {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	s := submitted{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		s.code = ee.ExitCode()
	default:
		t.Fatalf("run %s: %v", cmd.Path, err)
	}
	if s.stdout != "" {
		_ = json.Unmarshal(out.Bytes(), &s.res)
	}
	return s
}

// hit is one request a sink received.
type hit struct {
	Key  string
	Body string
}

// sink is a real HTTP server standing in for a downstream service. Its
// handler decides each response; every request is recorded.
type sink struct {
	*httptest.Server
	mu      sync.Mutex
	hits    []hit
	arrived chan hit
	respond func(n int, w http.ResponseWriter, r *http.Request) // n: 1-based request number
}

func newSink(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *sink {
	t.Helper()
	s := &sink{arrived: make(chan hit, 1024), respond: respond}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := hit{Key: r.Header.Get("Idempotency-Key"), Body: string(body)}
		s.mu.Lock()
		s.hits = append(s.hits, h)
		n := len(s.hits)
		s.mu.Unlock()
		s.arrived <- h
		if s.respond != nil {
			s.respond(n, w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"sent":true,"n":%d}`, n)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hits)
}

func (s *sink) all() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// waitHit waits for the next request to arrive.
func (s *sink) waitHit(t *testing.T, d time.Duration) hit {
	t.Helper()
	select {
	case h := <-s.arrived:
		return h
	case <-time.After(d):
		t.Fatalf("no request reached the sink within %s", d)
		return hit{}
	}
}

// connect opens a NATS connection for the test's own raw publishes.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, url)
}

// publishRaw publishes data on subject with a reply inbox (and no
// Nats-Msg-Id, so publish dedup does not apply), and returns a function that
// waits for the answer.
func publishRaw(t *testing.T, nc *nats.Conn, subject string, data []byte) func(d time.Duration) intent.Result {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(intent.HeaderReplyTo, inbox)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	return func(d time.Duration) intent.Result {
		t.Helper()
		defer func() { _ = sub.Unsubscribe() }()
		m, err := sub.NextMsg(d)
		require.NoError(t, err, "no answer on %s", subject)
		var res intent.Result
		require.NoError(t, json.Unmarshal(m.Data, &res), "answer: %s", m.Data)
		return res
	}
}

// freePort returns a free loopback TCP port.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lines splits s into its non-empty lines.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
