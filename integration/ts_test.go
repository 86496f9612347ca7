package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The TypeScript client (clients/ts) against real workers: its key
// derivation reproduces the protocol's vectors, and an operation fired by
// either client is replayed, not fired again, by the other.
//
// These tests need node (20 or later) and npm. Without them they skip —
// unless the CI environment variable is set, where they fail instead, so CI
// cannot pass without having run them. npm ci needs the npm registry.

// tsSetupTimeout bounds npm ci plus the build.
const tsSetupTimeout = 5 * time.Minute

// nodePackage is one install (and build) of a node package of the
// repository, shared by every test of a run.
type nodePackage struct {
	path  string     // relative to the repository root
	what  string     // what its tests are, for the skip message
	steps [][]string // run in the package's directory, in order
	once  sync.Once
	dir   string
	err   error
}

var (
	tsBuild = &nodePackage{path: "clients/ts", what: "TypeScript client tests", steps: [][]string{
		{"npm", "ci", "--no-audit", "--no-fund", "--engine-strict"},
		{"npm", "run", "build"},
	}}
	mcpE2E = &nodePackage{path: "clients/mcp-e2e", what: "TypeScript MCP SDK test", steps: [][]string{
		{"npm", "ci", "--no-audit", "--no-fund"},
	}}
)

// tsClient returns the directory of the built TypeScript client, installing
// and building it on first use. It skips the test when node or npm is
// missing outside CI.
func tsClient(t *testing.T) string { return tsBuild.setup(t) }

// setup returns the package's directory, installed on first use; it skips
// the test when node or npm is missing outside CI.
func (p *nodePackage) setup(t *testing.T) string {
	t.Helper()
	skipShort(t, "the "+p.what)
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "" {
				t.Skipf("%s is not installed: skipping the %s (set CI=1 to make this a failure)", tool, p.what)
			}
			t.Fatalf("%s is not installed, and CI is set: the %s must run in CI", tool, p.what)
		}
	}
	p.once.Do(func() {
		dir, err := filepath.Abs(filepath.Join("..", p.path))
		if err != nil {
			p.err = err
			return
		}
		p.dir = dir
		ctx, cancel := context.WithTimeout(context.Background(), tsSetupTimeout)
		defer cancel()
		for _, step := range p.steps {
			start := time.Now()
			out, err := runIn(ctx, dir, step...)
			if err != nil {
				p.err = fmt.Errorf("%s: %w\n%s", strings.Join(step, " "), err, out)
				return
			}
			t.Logf("%s: %s took %s", p.path, strings.Join(step, " "), time.Since(start).Round(time.Millisecond))
		}
	})
	require.NoError(t, p.err, "install %s", p.path)
	return p.dir
}

// runIn runs a command in dir and returns its combined output.
func runIn(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// tsSubmit runs the TypeScript client's command line (dist/cli.js submit)
// and decodes its answer, as submit does for the Go binary.
func tsSubmit(t *testing.T, dir, url string, args ...string) submitted {
	t.Helper()
	return tsRun(t, dir, append([]string{"submit", "--servers", url}, args...)...)
}

// tsRun runs dist/cli.js with args and decodes the answer it prints.
func tsRun(t *testing.T, dir string, args ...string) submitted {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir, "dist", "cli.js")}, args...)...)
	s := runClient(t, cmd)
	if s.stdout != "" {
		require.NoError(t, json.Unmarshal([]byte(s.stdout), &s.res), "answer: %s", s.stdout)
	}
	return s
}

// tsTools is a tools file whose key specs the clients must learn from the
// catalogue: send_email is keyed by to and subject with body volatile;
// weekly_digest by user per 168h window.
func tsTools(url string) string {
	return fmt.Sprintf(`tools:
  send_email:
    effect: webhook
    key_args: [to, subject]
    volatile_args: [body]
    lease: 30s
    webhook:
      url: %[1]s/email
      timeout: 30s
      retry: {max_attempts: 4, initial_interval: 50ms, max_interval: 200ms}
  weekly_digest:
    effect: webhook
    key_args: [user]
    window: 168h
    lease: 30s
    webhook:
      url: %[1]s/digest
      timeout: 30s
`, url)
}

// The package's own tests: every protocol vector byte for byte, validation,
// exit statuses.
func TestTSClientVectors(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runIn(ctx, dir, "npm", "test")
	require.NoError(t, err, "npm test in clients/ts:\n%s", out)
	require.Contains(t, out, "# fail 0", out)
}

// (a) The TypeScript client fires; the Go submit sends the same operation
// (another volatile body, other member order) and is answered replayed, with
// the same key and result.
func TestTSFiresGoReplays(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))

	ts := tsSubmit(t, dir, url, "--tool", "send_email", "--session", "run-7",
		"--args", `{"to":"ada@example.com","subject":"Welcome","body":"Hi Ada"}`, "--wait", "30000")
	require.Equal(t, 0, ts.code, "the TypeScript client fires: %s %s", ts.stdout, ts.stderr)
	require.Equal(t, intent.StatusCompleted, ts.res.Status)
	require.False(t, ts.res.Replayed)

	goRun := submit(t, url, "--tool", "send_email", "--session", "run-7",
		"--args", `{"body":"Hello Ada","subject":"Welcome","to":"ada@example.com"}`, "--wait", "30s")
	require.Equal(t, 3, goRun.code, "Go submit replays: %s %s", goRun.stdout, goRun.stderr)
	require.True(t, goRun.res.Replayed)
	require.Equal(t, ts.res.Key, goRun.res.Key, "both clients derive one key")
	require.Equal(t, ts.res.Fingerprint, goRun.res.Fingerprint, "body is volatile: one fingerprint")
	require.JSONEq(t, string(ts.res.Result), string(goRun.res.Result))

	again := tsSubmit(t, dir, url, "--tool", "send_email", "--session", "run-7",
		"--args", `{"to":"ada@example.com","subject":"Welcome","body":"Hi Ada"}`, "--wait", "30000")
	require.Equal(t, 3, again.code, "a TypeScript repeat replays: %s", again.stderr)
	require.JSONEq(t, string(ts.res.Result), string(again.res.Result))

	require.Equal(t, 1, hook.count(), "the sink is hit once")
	require.Equal(t, ts.res.Key, hook.all()[0].Key, "the effect carries the key")
}

// (b) The Go submit fires a window tool's operation; the TypeScript client's
// copy is a publish duplicate answered from the ledger: replayed.
func TestGoFiresTSReplays(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))

	goRun := submit(t, url, "--tool", "weekly_digest", "--args", `{"user":42}`,
		"--created-at", "2025-01-06T10:00:00Z", "--wait", "30s")
	require.Equal(t, 0, goRun.code, "Go submit fires: %s %s", goRun.stdout, goRun.stderr)

	// Later in the same 168h window: the same operation.
	ts := tsSubmit(t, dir, url, "--tool", "weekly_digest", "--args", `{"user":42}`,
		"--created-at", "2025-01-08T23:59:59Z", "--wait", "30000")
	require.Equal(t, 3, ts.code, "the TypeScript client replays: %s %s", ts.stdout, ts.stderr)
	require.Equal(t, intent.StatusCompleted, ts.res.Status)
	require.True(t, ts.res.Replayed)
	require.Equal(t, goRun.res.Key, ts.res.Key)
	require.JSONEq(t, string(goRun.res.Result), string(ts.res.Result))
	require.Equal(t, 1, hook.count(), "the sink is hit once")
}

// (c) The same override key with other args: the TypeScript client reports
// the conflict itself (its publish is a duplicate, the ledger's fingerprint
// differs), and so does Go submit. Never fired.
func TestTSConflict(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))

	first := tsSubmit(t, dir, url, "--tool", "send_email", "--key", "order-98765",
		"--args", `{"to":"a@example.com","subject":"Receipt 10"}`, "--wait", "30000")
	require.Equal(t, 0, first.code, "%s %s", first.stdout, first.stderr)

	ts := tsSubmit(t, dir, url, "--tool", "send_email", "--key", "order-98765",
		"--args", `{"to":"a@example.com","subject":"Receipt 20"}`, "--wait", "30000")
	require.Equal(t, 4, ts.code, "conflict exits 4: %s %s", ts.stdout, ts.stderr)
	require.Equal(t, intent.StatusConflict, ts.res.Status)
	require.NotNil(t, ts.res.Error)
	require.Equal(t, intent.CodeConflict, ts.res.Error.Code)
	require.False(t, ts.res.Replayed, "a conflict is an answer about this call, not a replay")
	require.Equal(t, first.res.Key, ts.res.Key)
	require.Contains(t, ts.stdout, `"record_fingerprint": "`+first.res.Fingerprint+`"`, "the record's fingerprint beside the caller's")
	require.NotEqual(t, first.res.Fingerprint, ts.res.Fingerprint, "the conflict's fingerprint is the caller's")

	goRun := submit(t, url, "--tool", "send_email", "--key", "order-98765",
		"--args", `{"to":"a@example.com","subject":"Receipt 20"}`, "--wait", "30s")
	require.Equal(t, 4, goRun.code, "Go agrees: %s %s", goRun.stdout, goRun.stderr)
	require.Equal(t, ts.res.Key, goRun.res.Key)

	require.Equal(t, 1, hook.count(), "never fired for the conflicting args")
}

// (d) An operation behind the approval gate: the TypeScript client is
// answered awaiting_approval (exit 6); with --wait-final it waits through the
// operator's approval for the final answer. The approval is given with the
// TypeScript command line too (its answer: the firing it let happen), and a
// denial given with it reaches a Go submit waiting with --wait-final.
func TestTSWaitsForTheFinalAnswer(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	srv := natstest.RunServer(t)
	url := srv.ClientURL()
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  refund:
    effect: webhook
    key_args: [order]
    approval: required
    webhook: {url: %s}
`, hook.URL)))
	args := `{"order":"12345","amount":7}`
	parked := tsSubmit(t, dir, url, "--tool", "refund", "--args", args, "--wait", "30000")
	require.Equal(t, 6, parked.code, "awaiting approval exits 6: %s %s", parked.stdout, parked.stderr)
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status)

	js, err := jetstreamFor(connect(t, url))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A watch of the key creates no consumer: it subscribes to the key's
	// subject and reads the stream leader.
	ledger, err := js.Stream(ctx, "KV_IDEM_LEDGER")
	require.NoError(t, err)
	info, err := ledger.Info(ctx)
	require.NoError(t, err)
	consumers := info.State.Consumers
	subject := "$KV.IDEM_LEDGER." + storedKey(t, js, parked.res.Key)
	watches := func() int {
		connz, err := srv.Connz(&server.ConnzOptions{Subscriptions: true})
		require.NoError(t, err)
		n := 0
		for _, c := range connz.Conns {
			n += strings.Count(strings.Join(c.Subs, "\n")+"\n", subject+"\n")
		}
		return n
	}
	before := watches()

	final := make(chan submitted, 1)
	go func() {
		final <- tsSubmit(t, dir, url, "--tool", "refund", "--args", args, "--wait", "60s", "--wait-final")
	}()
	watched := make(chan submitted, 1)
	go func() { watched <- tsRun(t, dir, "watch", "--servers", url, parked.res.Key, "--wait", "60s") }()
	// Its copy is a publish duplicate: it reads the record (awaiting
	// approval) and watches the key. Approve only once it waits.
	require.Eventually(t, func() bool { return watches() >= before+2 }, 30*time.Second, 20*time.Millisecond,
		"the TypeScript client and its watch command watch the ledger key")
	require.Equal(t, 0, hook.count(), "nothing fires before approval")
	info, err = ledger.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, consumers, info.State.Consumers, "no consumer was created to watch the key")
	wrong := tsDecide(t, dir, url, "approve", parked.res.Key, "--fingerprint", strings.Repeat("0", 64), "--by", "ops")
	require.Equal(t, 5, wrong.code, "an approval for other arguments is rejected: %s %s", wrong.stdout, wrong.stderr)
	require.Equal(t, intent.CodeConflict, wrong.res.Error.Code)
	approved := tsDecide(t, dir, url, "approve", parked.res.Key, "--fingerprint", parked.res.Fingerprint, "--by", "ops")
	require.Equal(t, 0, approved.code, approved.stdout+approved.stderr)
	require.Equal(t, intent.StatusCompleted, approved.res.Status)

	f := <-final
	require.Equal(t, 3, f.code, "the final answer, replayed: %s %s", f.stdout, f.stderr)
	require.Equal(t, intent.StatusCompleted, f.res.Status)
	require.Equal(t, parked.res.Key, f.res.Key)
	require.Equal(t, 1, hook.count(), "fired once, on approval")
	w := <-watched
	require.Equal(t, 0, w.code, "watch: the final record, completed: %s %s", w.stdout, w.stderr)
	require.Contains(t, w.stderr, "awaiting_approval; waiting for its final answer")
	require.Equal(t, intent.StatusCompleted, w.res.Status)

	other := `{"order":"67890","amount":9}`
	parked = submit(t, url, "--tool", "refund", "--args", other, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status, parked.stdout+parked.stderr)
	goFinal := make(chan submitted, 1)
	go func() {
		goFinal <- submit(t, url, "--tool", "refund", "--args", other, "--wait", "60s", "--wait-final")
	}()
	goWatched := make(chan submitted, 1)
	go func() { goWatched <- tsRun(t, dir, "watch", "--servers", url, parked.res.Key, "--wait", "60s") }()
	denied := tsDecide(t, dir, url, "deny", parked.res.Key, "--by", "ops", "--reason", "fraud suspected")
	require.Equal(t, 0, denied.code, "a denial that took effect exits 0: %s %s", denied.stdout, denied.stderr)
	require.Equal(t, intent.StatusDenied, denied.res.Status)
	g := <-goFinal
	require.Equal(t, intent.StatusDenied, g.res.Status, g.stdout+g.stderr)
	require.Contains(t, g.res.Error.Message, "fraud suspected")
	require.Equal(t, 1, hook.count(), "a denied operation never fires")
	dw := <-goWatched
	require.Equal(t, 5, dw.code, "watch: denied exits 5: %s %s", dw.stdout, dw.stderr)
	require.Equal(t, intent.StatusDenied, dw.res.Status)
	never := tsRun(t, dir, "watch", "--servers", url, "refund."+strings.Repeat("ab", 32), "--wait", "1s")
	require.Equal(t, 2, never.code, never.stderr)
	require.Contains(t, never.stderr, "no record yet")
	require.Contains(t, tsRun(t, dir, "watch", "--servers", url, "not-a-key").stderr, "is not a key")

	bad := tsDecide(t, dir, url, "resolve", parked.res.Key, "--outcome", "maybe")
	require.Equal(t, 1, bad.code, "a malformed decision is refused before it is sent")
	require.Contains(t, bad.stderr, `outcome "maybe"`)
}

// tsDecide runs an operator decision with the TypeScript command line.
func tsDecide(t *testing.T, dir, url, op string, args ...string) submitted {
	t.Helper()
	return tsRun(t, dir, append([]string{op, "--servers", url}, args...)...)
}
