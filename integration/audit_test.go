package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// trailEntry is one line of an exported trail, decoded.
type trailEntry struct {
	Partition int             `json:"partition"`
	Pos       uint64          `json:"pos"`
	Event     audit.Event     `json:"event"`
	Raw       json.RawMessage `json:"-"`
}

// history is the audit trail's entries about key, read with submit audit
// show --json.
func history(t *testing.T, url, key string) []trailEntry {
	t.Helper()
	s := submit(t, url, "audit", "show", key, "--json")
	var out []trailEntry
	for _, l := range lines(s.stdout) {
		var e trailEntry
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
		e.Raw = json.RawMessage(l)
		out = append(out, e)
	}
	return out
}

// waitHistory waits until key's history has an event that matches.
func waitHistory(t *testing.T, url, key string, match func(audit.Event) bool, what string) []trailEntry {
	t.Helper()
	var h []trailEntry
	require.Eventually(t, func() bool {
		h = history(t, url, key)
		for _, e := range h {
			if match(e.Event) {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "the trail of %s has %s", key, what)
	return h
}

func kind(k audit.Kind) func(audit.Event) bool {
	return func(e audit.Event) bool { return e.Kind == k }
}

// verifyTrail runs submit audit verify on a trail file with a keys file.
func verifyTrail(t *testing.T, url, file, keys string) submitted {
	t.Helper()
	return submit(t, url, "audit", "verify", file, "--keys", keys)
}

// An operation taken over from a worker killed mid-effect, one approved,
// one forgotten and a conflict all leave their events in the trail; the
// exported trail verifies with the workers' keys, and editing one byte,
// dropping a line or swapping two makes verify fail and name the place.
// Every final answer's receipt verifies, for its own answer only.
func TestAuditTrailRecordsAndVerifies(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/email" && n == 1 {
			select { // the first firing hangs: its worker is killed meanwhile
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"sent":true,"n":%d}`, n)
	})
	defer close(release)
	tools := writeTools(t, fmt.Sprintf(`tools:
  send_email:
    effect: webhook
    key_args: [to]
    lease: 2s
    webhook: {url: %[1]s/email, timeout: 60s}
  charge:
    effect: webhook
    key_args: [order]
    approval: required
    audit_args: true
    webhook: {url: %[1]s/charge}
  echo:
    effect: noop
    key_args: [n]
`, hook.URL))
	keyDir := t.TempDir()
	workers := map[string]*proc{}
	for _, name := range []string{"w1", "w2"} {
		workers[name] = startWorker(t, name, url, tools, "--ack-wait", "2s", "--audit-key", filepath.Join(keyDir, name+".key"))
	}
	// The keys the workers published, saved as an auditor keeps them.
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	ks := submit(t, url, "audit", "keys")
	require.Equal(t, 0, ks.code, ks.stderr)
	require.NoError(t, os.WriteFile(keysFile, []byte(ks.stdout), 0o644))
	keys, err := audit.LoadKeys(keysFile)
	require.NoError(t, err)
	require.Equal(t, 2, keys.Len())

	// A takeover: the holder dies mid-effect, the other worker fires again.
	final := make(chan submitted, 1)
	go func() {
		final <- submit(t, url, "--tool", "send_email", "--args", `{"to":"ada@example.com","body":"hi"}`, "--wait", "90s")
	}()
	first := hook.waitHit(t, 30*time.Second)
	nc := connect(t, url)
	cl, err := client.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec, err := cl.Get(ctx, first.Key)
	require.NoError(t, err)
	victim := rec.Holder
	workers[victim].kill()
	mail := <-final
	require.Equal(t, intent.StatusCompleted, mail.res.Status, mail.stdout+mail.stderr)
	ev, err := audit.VerifyReceipt(mail.res, keys)
	require.NoError(t, err, "the answer's receipt verifies")
	require.NotEqual(t, victim, ev.Holder)
	require.Equal(t, 2, ev.Attempt, "recorded by the second claim")

	// An approval, then a forget.
	parked := submit(t, url, "--tool", "charge", "--args", `{"order":"o-1","amount":500}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status, parked.stdout+parked.stderr)
	require.Empty(t, parked.res.Receipt, "an answer that is not final carries no receipt")
	approved := submit(t, url, "approve", parked.res.Key, "--fingerprint", parked.res.Fingerprint, "--by", "alice", "--reason", "customer called")
	require.Equal(t, intent.StatusCompleted, approved.res.Status, approved.stdout+approved.stderr)
	_, err = audit.VerifyReceipt(approved.res, keys)
	require.NoError(t, err)
	forgot := submit(t, url, "forget", parked.res.Key, "--by", "bob", "--reason", "charge again")
	require.Equal(t, 0, forgot.code, forgot.stdout+forgot.stderr)

	// A conflict a worker answers (no Nats-Msg-Id, so it reaches one).
	echo := submit(t, url, "--tool", "echo", "--args", `{"n":1}`)
	require.Equal(t, intent.StatusCompleted, echo.res.Status, echo.stdout+echo.stderr)
	conflict := publishRaw(t, nc, "idem.intents.echo", []byte(`{"tool":"echo","args":{"n":1,"x":2}}`))(30 * time.Second)
	require.Equal(t, intent.StatusConflict, conflict.Status)
	_, err = audit.VerifyReceipt(conflict, keys)
	require.NoError(t, err, "the conflict answer's receipt")

	// A receipt verifies for its own answer only.
	swapped := mail.res
	swapped.Receipt = approved.res.Receipt
	_, err = audit.VerifyReceipt(swapped, keys)
	require.ErrorIs(t, err, audit.ErrReceiptMismatch)
	changed := mail.res
	changed.Result = json.RawMessage(`{"sent":false}`)
	_, err = audit.VerifyReceipt(changed, keys)
	require.ErrorIs(t, err, audit.ErrReceiptMismatch)
	// The client checks them itself when given the keys.
	vcl, err := client.New(nc, client.WithReceiptKeys(keys))
	require.NoError(t, err)
	res, err := vcl.Submit(ctx, &intent.Envelope{Tool: "echo", Args: json.RawMessage(`{"n":2}`)})
	require.NoError(t, err)
	require.NotEmpty(t, res.Receipt)
	other, err := audit.NewKeySet(audit.PublicKey{ID: keys.Keys()[0].ID, Key: keys.Keys()[0].Key, NotAfter: time.Unix(1, 0)})
	require.NoError(t, err)
	ocl, err := client.New(nc, client.WithReceiptKeys(other))
	require.NoError(t, err)
	_, err = ocl.Submit(ctx, &intent.Envelope{Tool: "echo", Args: json.RawMessage(`{"n":2}`)})
	require.ErrorIs(t, err, client.ErrBadReceipt, "keys that do not vouch for it")

	// Each operation's history, once written.
	h := waitHistory(t, url, first.Key, kind(audit.KindTakeover), "the takeover")
	for _, e := range h {
		if e.Event.Kind == audit.KindTakeover {
			require.Equal(t, audit.ReasonConfirmedAbandoned, e.Event.Reason)
			require.Equal(t, victim, e.Event.PreviousHolder)
			require.Equal(t, 1, e.Event.PreviousAttempt)
		}
	}
	waitHistory(t, url, first.Key, kind(audit.KindOutcome), "the outcome")
	h = waitHistory(t, url, parked.res.Key, kind(audit.KindForgotten), "the forget")
	// Two workers append to one chain: in the order of their appends, by
	// their times.
	slices.SortStableFunc(h, func(a, b trailEntry) int { return a.Event.At.Compare(b.Event.At) })
	var kinds []audit.Kind
	for _, e := range h {
		kinds = append(kinds, e.Event.Kind)
		switch e.Event.Kind {
		case audit.KindDecision:
			require.Equal(t, intent.ControlApprove, e.Event.Op)
			require.Equal(t, "alice", e.Event.By)
			require.Equal(t, "customer called", e.Event.Reason)
		case audit.KindForgotten:
			require.Equal(t, parked.res.Fingerprint, e.Event.Fingerprint, "the deleted record's")
			require.Equal(t, "bob", e.Event.By)
			require.Equal(t, "charge again", e.Event.Reason)
		case audit.KindClaimed, audit.KindFired:
			require.JSONEq(t, `{"order":"o-1","amount":500}`, string(e.Event.Args), "audit_args: the args themselves")
		}
	}
	// Parked (claimed), approved, then claimed and fired at once: one fired
	// event records that claim and its firing.
	require.Equal(t, []audit.Kind{audit.KindClaimed, audit.KindOutcome, audit.KindDecision, audit.KindFired,
		audit.KindOutcome, audit.KindForgotten}, kinds)
	h = waitHistory(t, url, echo.res.Key, kind(audit.KindConflict), "the conflict")
	claims := 0
	for _, e := range h {
		if e.Event.Kind == audit.KindFired {
			claims++
			require.Empty(t, e.Event.Args, "args by digest only")
			require.NotEmpty(t, e.Event.ArgsDigest)
			require.NotZero(t, e.Event.IntentSeq)
			require.NotEmpty(t, e.Event.Fingerprint)
		}
	}
	require.Equal(t, 1, claims, "one claim, fired at once")
	show := submit(t, url, "audit", "show", first.Key)
	require.Contains(t, show.stdout, "takeover")
	require.Contains(t, show.stdout, "previous_holder="+victim)

	// The whole trail, exported, verifies.
	file := filepath.Join(t.TempDir(), "trail.jsonl")
	exp := submit(t, url, "audit", "export", "-o", file)
	require.Equal(t, 0, exp.code, exp.stderr)
	v := verifyTrail(t, url, file, keysFile)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	require.Contains(t, v.stdout, "verified:")
	// Without --keys: the published ones.
	v = submit(t, url, "audit", "verify", file)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)

	data, err := os.ReadFile(file)
	require.NoError(t, err)
	trail := bytes.Split(bytes.TrimSpace(data), []byte{'\n'})
	require.Greater(t, len(trail), 12)
	tampered := func(name string, ls [][]byte) submitted {
		p := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(p, append(bytes.Join(ls, []byte{'\n'}), '\n'), 0o644))
		return verifyTrail(t, url, p, keysFile)
	}
	broken := regexp.MustCompile(`BROKEN: line (\d+) \(partition (\d+), position (\d+)\): (\w+)`)
	requireBreak := func(s submitted, kinds ...string) []string {
		t.Helper()
		require.Equal(t, 7, s.code, s.stdout+s.stderr)
		m := broken.FindStringSubmatch(s.stdout)
		require.NotNil(t, m, s.stdout)
		require.Contains(t, kinds, m[4], s.stdout)
		return m
	}
	// One byte of one event: a holder's name in an unsigned event.
	edited := cloneLines(trail)
	i := indexOf(edited, `"kind":"fired"`)
	edited[i] = bytes.Replace(edited[i], []byte(`"holder":"w`), []byte(`"holder":"W`), 1)
	m := requireBreak(tampered("edited.jsonl", edited), "edited", "bad_signature")
	require.Equal(t, fmt.Sprint(i+1), m[1], "the edited line is named")
	// One byte of a receipt: its signature.
	edited = cloneLines(trail)
	i = indexOf(edited, `"kind":"outcome"`, `"status":"completed"`)
	edited[i] = bytes.Replace(edited[i], []byte(`"status":"completed"`), []byte(`"status":"completeD"`), 1)
	m = requireBreak(tampered("receipt.jsonl", edited), "bad_signature")
	require.Equal(t, fmt.Sprint(i+1), m[1])
	// A line dropped.
	drop := len(trail) / 2
	m = requireBreak(tampered("dropped.jsonl", append(cloneLines(trail)[:drop:drop], trail[drop+1:]...)), "dropped", "reordered")
	require.Equal(t, fmt.Sprint(drop+1), m[1], "named where the chain breaks")
	// Two lines swapped.
	swappedLines := cloneLines(trail)
	swappedLines[drop], swappedLines[drop+1] = swappedLines[drop+1], swappedLines[drop]
	m = requireBreak(tampered("reordered.jsonl", swappedLines), "reordered")
	require.Equal(t, fmt.Sprint(drop+1), m[1])

	// The operator API serves a history, to operators whose namespace its
	// events are in, and the published keys to anyone with a token.
	gw := startGateway(t, url)
	r := gw.do(t, http.MethodGet, "/v1/operations/"+first.Key+"/history", operator, "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	var got struct {
		Key     string       `json:"key"`
		Entries []trailEntry `json:"entries"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.raw), &got))
	require.Equal(t, first.Key, got.Key)
	require.NotEmpty(t, got.Entries)
	requireProblem(t, gw.do(t, http.MethodGet, "/v1/operations/"+first.Key+"/history", operatorA, ""), http.StatusNotFound, intent.CodeNotFound)
	requireProblem(t, gw.do(t, http.MethodGet, "/v1/operations/"+first.Key+"/history", agentA, ""), http.StatusForbidden, "forbidden")
	r = gw.do(t, http.MethodGet, "/v1/audit/keys", agentA, "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	httpKeys, err := audit.ParseKeys([]byte(r.raw))
	require.NoError(t, err)
	require.Equal(t, keys.Keys(), httpKeys.Keys())
}

func cloneLines(ls [][]byte) [][]byte {
	out := make([][]byte, len(ls))
	for i := range ls {
		out[i] = bytes.Clone(ls[i])
	}
	return out
}

// indexOf is the first line holding every one of ss.
func indexOf(ls [][]byte, ss ...string) int {
next:
	for i, l := range ls {
		for _, s := range ss {
			if !bytes.Contains(l, []byte(s)) {
				continue next
			}
		}
		return i
	}
	panic(fmt.Sprintf("no line holds %q", ss))
}

// While the audit stream cannot be reached, operations go on and none is
// lost: each is answered, with its receipt; the events beyond the worker's
// queue are dropped, counted, and the trail shows them as a gap once it is
// back — it still verifies.
func TestAuditOutageLosesNoOperation(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	tools := writeTools(t, `tools:
  echo:
    effect: noop
    key_args: [n]
`)
	w := startWorker(t, "w1", url, tools, "--audit-queue", "4")
	nc := connect(t, url)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(n int) intent.Result {
		s := submit(t, url, "--tool", "echo", "--args", fmt.Sprintf(`{"n":%d}`, n))
		require.Equal(t, 0, s.code, s.stdout+s.stderr)
		require.NotEmpty(t, s.res.Receipt)
		return s.res
	}
	run(0)

	// The audit stream stops taking the trail's subjects: to a worker it is
	// as gone as its server.
	stream, err := js.Stream(ctx, "IDEM_AUDIT")
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	parked := cfg
	parked.Subjects = []string{"parked.audit.*"}
	_, err = js.UpdateStream(ctx, parked)
	require.NoError(t, err)
	var during []intent.Result
	for n := 1; n <= 10; n++ {
		during = append(during, run(n))
	}
	w.waitLog(t, "audit trail unreachable", 30*time.Second)
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	w.waitLog(t, "audit trail reachable again", 30*time.Second)
	run(11)

	// Every operation has its record, and the trail a gap.
	for _, res := range during {
		rec := submit(t, url, "get", res.Key)
		require.Contains(t, rec.stdout, `"status": "completed"`)
	}
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	file := filepath.Join(t.TempDir(), "trail.jsonl")
	var v submitted
	require.Eventually(t, func() bool {
		ks := submit(t, url, "audit", "keys")
		require.NoError(t, os.WriteFile(keysFile, []byte(ks.stdout), 0o644))
		require.Equal(t, 0, submit(t, url, "audit", "export", "-o", file).code)
		v = verifyTrail(t, url, file, keysFile)
		return strings.Contains(v.stdout, "gap: ")
	}, 30*time.Second, 200*time.Millisecond, "the trail shows the gap")
	require.Equal(t, 0, v.code, "a gap is not a break: %s", v.stdout)
	m := regexp.MustCompile(`gap: partition 0 position \d+: w1 dropped (\d+) events from `).FindStringSubmatch(v.stdout)
	require.NotNil(t, m, v.stdout)
	dropped, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.Positive(t, dropped, "ten operations made 30 events; the queue held 4")
	require.Contains(t, v.stdout, "verified:")
}

// The TypeScript client verifies receipts with the keys it is given: an
// answer signed by the workers' key passes, and with keys that do not vouch
// for it the client refuses the answer.
func TestTSVerifiesReceipts(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, `tools:
  echo:
    effect: noop
    key_args: [n]
`))
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	ks := submit(t, url, "audit", "keys")
	require.Equal(t, 0, ks.code, ks.stderr)
	require.NoError(t, os.WriteFile(keysFile, []byte(ks.stdout), 0o644))

	ok := tsSubmit(t, dir, url, "--tool", "echo", "--args", `{"n":1}`, "--receipt-keys", keysFile, "--wait", "30000")
	require.Equal(t, 0, ok.code, ok.stdout+ok.stderr)
	require.NotEmpty(t, ok.res.Receipt)
	replay := tsSubmit(t, dir, url, "--tool", "echo", "--args", `{"n":1}`, "--receipt-keys", keysFile, "--wait", "30000")
	require.Equal(t, 3, replay.code, "a replay's receipt verifies too: %s", replay.stdout+replay.stderr)
	require.JSONEq(t, string(ok.res.Receipt), string(replay.res.Receipt))

	stranger, err := audit.GenerateSigner()
	require.NoError(t, err)
	other, err := audit.NewKeySet(stranger.Public("stranger", time.Time{}))
	require.NoError(t, err)
	data, err := json.Marshal(other)
	require.NoError(t, err)
	otherFile := filepath.Join(t.TempDir(), "other.json")
	require.NoError(t, os.WriteFile(otherFile, data, 0o644))
	bad := tsSubmit(t, dir, url, "--tool", "echo", "--args", `{"n":1}`, "--receipt-keys", otherFile, "--wait", "30000")
	require.Equal(t, 1, bad.code, bad.stdout+bad.stderr)
	require.Contains(t, bad.stderr, "unknown_signer")
}

// Under the hardened permissions (deployments/nats/secure) the worker
// writes the trail and publishes its key, and the operator exports,
// verifies and reads it, each refused nothing.
func TestSecureAuditTrail(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	w := s.startSecureWorker(t, "worker")
	agent := s.connect(t, "agent-1")
	key := submitAs(t, agent, `{"n":"audited"}`).Key
	run := func(args ...string) submitted {
		t.Helper()
		full := append(args, "--nats-url", s.url, "--tls-ca", s.ca.certPEM, "--nats-user", "operator", "--inbox-prefix", "_INBOX.operator")
		cmd := exec.Command(bin("submit"), full...)
		cmd.Env = append(os.Environ(), "IDEMGATE_NATS_PASSWORD="+s.password(t, "operator"))
		return runClient(t, cmd)
	}
	var show submitted
	require.Eventually(t, func() bool {
		show = run("audit", "show", key)
		return strings.Contains(show.stdout, "outcome")
	}, 30*time.Second, 100*time.Millisecond, "the operation's history: %s", show.stderr)
	file := filepath.Join(t.TempDir(), "trail.jsonl")
	exp := run("audit", "export", "-o", file)
	require.Equal(t, 0, exp.code, exp.stderr)
	v := run("audit", "verify", file)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	require.Contains(t, v.stdout, "verified:")
	require.Empty(t, s.violations(), "the worker and the operator were refused nothing")
	require.NotContains(t, w.log.String(), "could not publish the audit key")
}
