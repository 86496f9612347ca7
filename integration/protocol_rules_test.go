package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Worker behaviour docs/protocol.md specifies for every client's sake
// (sections 2, 5 and 7) and the workers do not show yet. Each test skips
// through awaitsWorkerRules; remove that call once the workers follow the
// rule it names.

// publishWithIdentity publishes data on subject with the client identity
// headers set to key and fp, and returns its stream sequence and a function
// waiting for the answer (its Idem-Intent-Seq header, and the answer).
func publishWithIdentity(t *testing.T, nc *nats.Conn, subject string, data []byte, key, fp string) (uint64, func(time.Duration) (string, intent.Result)) {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(intent.HeaderReplyTo, inbox)
	msg.Header.Set(intent.HeaderKey, key)
	msg.Header.Set(intent.HeaderFingerprint, fp)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ack, err := js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	return ack.Sequence, func(d time.Duration) (string, intent.Result) {
		t.Helper()
		defer func() { _ = sub.Unsubscribe() }()
		m, err := sub.NextMsg(d)
		require.NoError(t, err, "no answer on %s", subject)
		return m.Header.Get(intent.HeaderIntentSeq), decodeResult(t, m.Data)
	}
}

// A worker that derives another key or fingerprint than the client's
// headers rejects the intent with key_mismatch, naming both. The answer
// carries the worker's own derivation, never the headers' (anyone may copy
// another caller's), and is bound to the intent by its stream sequence
// (Idem-Intent-Seq), by which the client matches it. Nothing fires.
func TestKeyMismatchIsRejected(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	nc := connect(t, url)
	wrongKey, wrongFP := "send_email."+strings.Repeat("0", 64), strings.Repeat("0", 64)
	seq, wait := publishWithIdentity(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":{"to":"a@example.com"}}`), wrongKey, wrongFP)
	bound, res := wait(30 * time.Second)
	require.Equal(t, strconv.FormatUint(seq, 10), bound, "bound to the intent's stream sequence")
	require.Equal(t, intent.StatusRejected, res.Status)
	require.Equal(t, intent.CodeKeyMismatch, res.Error.Code)
	require.True(t, strings.HasPrefix(res.Key, "send_email."), "the worker's key: %q", res.Key)
	require.NotEqual(t, wrongKey, res.Key, "never the header's")
	require.NotEqual(t, wrongFP, res.Fingerprint)
	require.Contains(t, res.Error.Message, wrongKey)
	require.Contains(t, res.Error.Message, res.Key, "the worker's key is named too")
	require.False(t, res.Replayed)
	require.Equal(t, 0, hook.count())

	// Before a key is derived, the answer names none, whatever the headers say.
	seq, wait = publishWithIdentity(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":{},"x":1}`), wrongKey, wrongFP)
	bound, res = wait(30 * time.Second)
	require.Equal(t, strconv.FormatUint(seq, 10), bound)
	require.Equal(t, intent.CodeInvalidIntent, res.Error.Code)
	require.Empty(t, res.Key)
	require.Empty(t, res.Fingerprint)
}

// A rejection given before the worker could derive a key names no key; the
// client takes it by its Idem-Intent-Seq: a TypeScript submit of an unknown
// tool is answered at once (exit 5), not after its wait.
func TestRejectionBeforeDerivationIsBoundBySequence(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))
	start := time.Now()
	ts := tsSubmit(t, dir, url, "--tool", "send_emial", "--args", `{"to":"a@example.com"}`, "--wait", "20s")
	require.Equal(t, 5, ts.code, "%s %s", ts.stdout, ts.stderr)
	require.Equal(t, intent.CodeUnknownTool, ts.res.Error.Code)
	require.Contains(t, ts.res.Error.Message, `did you mean "send_email"?`)
	require.False(t, ts.res.Replayed, "a rejection is about this call")
	require.Less(t, time.Since(start), 15*time.Second)
}

// replayed is true exactly when the answer reports an outcome a different
// call caused: the call that creates an operation awaiting approval is
// answered replayed false and without completed_at, and so is that same
// caller when the approved operation fires; a second caller is replayed.
func TestReplayedMeansAnotherCall(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, demoTools(t, hook.URL))

	args := `{"order_id":"o-9","amount_cents":500}`
	parked := submit(t, url, "--tool", "refund", "--args", args, "--wait", "30s")
	require.Equal(t, 6, parked.code, parked.stdout+parked.stderr)
	require.False(t, parked.res.Replayed, "Go: the creating call is no replay")
	require.NotContains(t, parked.stdout, "completed_at", "a non-final answer has no completed_at")

	tsParked := tsSubmit(t, dir, url, "--tool", "refund", "--args", `{"order_id":"o-10"}`, "--wait", "30000")
	require.Equal(t, 6, tsParked.code, tsParked.stdout+tsParked.stderr)
	require.False(t, tsParked.res.Replayed, "TypeScript: the creating call is no replay")

	creator := make(chan submitted, 1)
	go func() {
		creator <- tsSubmit(t, dir, url, "--tool", "refund", "--args", `{"order_id":"o-11"}`, "--wait", "60s", "--wait-final")
	}()
	var key string
	require.Eventually(t, func() bool {
		k := submit(t, url, "key", "-q", "--tool", "refund", "--args", `{"order_id":"o-11"}`)
		key = strings.TrimSpace(k.stdout)
		return k.code == 0 && submit(t, url, "get", key).code == 0
	}, 30*time.Second, 100*time.Millisecond)
	approved := submit(t, url, "approve", key, "--yes")
	require.Equal(t, 0, approved.code, approved.stdout+approved.stderr)
	c := <-creator
	require.Equal(t, 0, c.code, "the creating caller, answered when its approved operation fired: no replay: %s %s", c.stdout, c.stderr)
	require.False(t, c.res.Replayed)

	second := submit(t, url, "--tool", "refund", "--args", `{"order_id":"o-11"}`, "--wait", "30s")
	require.Equal(t, 3, second.code, "another call: a replay")
}

// decodeResult decodes an answer.
func decodeResult(t *testing.T, data []byte) intent.Result {
	t.Helper()
	var res intent.Result
	require.NoError(t, json.Unmarshal(data, &res), "answer: %s", data)
	return res
}
