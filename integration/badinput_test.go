package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// badInputMaxBytes is the worker's --max-intent-bytes in the catalogue below.
const badInputMaxBytes = 4096

// badInput is one malformed intent and the answer it must get.
type badInput struct {
	name    string
	subject string // default: idem.intents.send_email
	data    string
	code    string // the answer's error.code
	message string // a fragment the answer's error.message must hold
}

// badInputs is the catalogue: every entry is answered rejected with its code,
// terminated, and never fires anything.
func badInputs() []badInput {
	nested := strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40)
	return []badInput{
		{name: "broken JSON", data: `{"tool":"send_email","args":`, code: intent.CodeInvalidIntent, message: "unexpected end of input"},
		{name: "not an object", data: `["send_email",{}]`, code: intent.CodeInvalidIntent, message: "must be a JSON object"},
		{name: "tool is a number", data: `{"tool":7,"args":{}}`, code: intent.CodeInvalidIntent, message: `"tool" must be a string`},
		{name: "args is a string", data: `{"tool":"send_email","args":"to=a@example.com"}`, code: intent.CodeInvalidIntent, message: `"args" must be an object`},
		{name: "args is an array", data: `{"tool":"send_email","args":[1,2]}`, code: intent.CodeInvalidIntent, message: `"args" must be an object`},
		{name: "session is null", data: `{"tool":"send_email","args":{},"session":null}`, code: intent.CodeInvalidIntent, message: `"session" must be a string`},
		{name: "key is null", data: `{"tool":"send_email","args":{},"key":null}`, code: intent.CodeInvalidIntent, message: `"key" must be a string`},
		{name: "session is a number", data: `{"tool":"send_email","args":{},"session":42}`, code: intent.CodeInvalidIntent, message: `"session" must be a string`},
		{name: "call_id is an object", data: `{"tool":"send_email","args":{},"call_id":{}}`, code: intent.CodeInvalidIntent, message: `"call_id" must be a string`},
		{name: "over --max-intent-bytes", data: `{"tool":"send_email","args":{"body":"` + strings.Repeat("x", 2*badInputMaxBytes) + `"}}`, code: intent.CodeTooLarge, message: "the limit is 4096"},
		{name: "nesting over the depth limit", data: `{"tool":"send_email","args":` + nested + `}`, code: intent.CodeInvalidIntent, message: "nesting deeper than"},
		{name: "invalid UTF-8", data: "{\"tool\":\"send_email\",\"args\":{\"to\":\"\xff\xfe\"}}", code: intent.CodeInvalidIntent, message: "invalid UTF-8"},
		{name: "lone surrogate escape", data: `{"tool":"send_email","args":{"to":"\ud800"}}`, code: intent.CodeInvalidIntent, message: "lone surrogate"},
		{name: "duplicate field", data: `{"tool":"send_email","args":{},"args":{"to":"a@example.com"}}`, code: intent.CodeInvalidIntent, message: "repeated"},
		{name: "duplicate field inside args", data: `{"tool":"send_email","args":{"to":"a@example.com","to":"b@example.com"}}`, code: intent.CodeInvalidIntent, message: "repeated"},
		{name: "integer beyond 2^53", data: `{"tool":"send_email","args":{"id":9007199254740993}}`, code: intent.CodeInvalidIntent, message: "2^53"},
		{name: "number 1e400", data: `{"tool":"send_email","args":{"x":1e400}}`, code: intent.CodeInvalidIntent, message: "1e400"},
		{name: "NaN literal", data: `{"tool":"send_email","args":{"x":NaN}}`, code: intent.CodeInvalidIntent, message: "expected a value"},
		{name: "created_at not RFC 3339", data: `{"tool":"send_email","args":{},"created_at":"yesterday"}`, code: intent.CodeInvalidIntent, message: "RFC 3339"},
		{name: "created_at with a space", data: `{"tool":"send_email","args":{},"created_at":"2025-01-02 15:04:05Z"}`, code: intent.CodeInvalidIntent, message: "RFC 3339"},
		{name: "empty key override", data: `{"tool":"send_email","args":{},"key":""}`, code: intent.CodeInvalidIntent, message: `"key" is empty`},
		{name: "key override over 256 bytes", data: `{"tool":"send_email","args":{},"key":"` + strings.Repeat("k", 257) + `"}`, code: intent.CodeInvalidIntent, message: "the limit is 256"},
		{name: "unknown field", data: `{"tool":"send_email","args":{},"priority":"high"}`, code: intent.CodeInvalidIntent, message: `unknown field "priority"`},
		{name: "field name in the wrong case", data: `{"Tool":"send_email","args":{}}`, code: intent.CodeInvalidIntent, message: "case-sensitive"},
		{name: "missing tool", data: `{"args":{}}`, code: intent.CodeInvalidIntent, message: `"tool" is required`},
		{name: "missing args", data: `{"tool":"send_email"}`, code: intent.CodeInvalidIntent, message: `"args" is required`},
		{name: "args null", data: `{"tool":"send_email","args":null}`, code: intent.CodeInvalidIntent, message: `"args" must be an object`},
		{name: "subject does not match the tool", data: `{"tool":"create_ticket","args":{}}`, code: intent.CodeToolMismatch, message: `"create_ticket"`},
		{name: "tool name with bad characters", subject: "idem.intents.Send-Email!", data: `{"tool":"Send-Email!","args":{}}`, code: intent.CodeInvalidIntent, message: "[a-z0-9_-]{1,64}"},
		{name: "tool name too long", subject: "idem.intents." + strings.Repeat("t", 65), data: `{"tool":"` + strings.Repeat("t", 65) + `","args":{}}`, code: intent.CodeInvalidIntent, message: "[a-z0-9_-]{1,64}"},
		{name: "unknown tool", subject: "idem.intents.launch_rocket", data: `{"tool":"launch_rocket","args":{}}`, code: intent.CodeUnknownTool, message: `"launch_rocket"`},
		{name: "unknown tool close to a known one", subject: "idem.intents.send_emial", data: `{"tool":"send_emial","args":{}}`, code: intent.CodeUnknownTool, message: `did you mean "send_email"?`},
		{name: "empty payload", data: ``, code: intent.CodeInvalidIntent, message: "unexpected end of input"},
		{name: "whitespace only", data: " \n\t ", code: intent.CodeInvalidIntent, message: "unexpected end of input"},
		{name: "trailing garbage", data: `{"tool":"send_email","args":{}} x`, code: intent.CodeInvalidIntent, message: "after the JSON value"},
		{name: "two envelopes", data: `{"tool":"send_email","args":{}}{"tool":"send_email","args":{}}`, code: intent.CodeInvalidIntent, message: "after the JSON value"},
		{name: "unescaped control character", data: "{\"tool\":\"send_email\",\"args\":{\"to\":\"a\x01b\"}}", code: intent.CodeInvalidIntent, message: "control character"},
	}
}

// The catalogue of malformed intents against a real worker: each is answered
// rejected with the right code and a message naming the problem, terminated
// (never redelivered, the work stream left empty), dead-lettered once with
// its reason, fires nothing, and the worker goes on serving.
func TestBadInputCatalogue(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	w := startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")),
		"--max-intent-bytes", "4096", "--ack-wait", "2s")
	nc := connect(t, url)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)

	cases := badInputs()
	require.GreaterOrEqual(t, len(cases), 20)
	for _, c := range cases {
		subject := c.subject
		if subject == "" {
			subject = "idem.intents.send_email"
		}
		res := publishRaw(t, nc, subject, []byte(c.data))(15 * time.Second)
		require.Equal(t, intent.StatusRejected, res.Status, "%s: %+v", c.name, res)
		require.False(t, res.Replayed, "%s: a rejection is this call's own outcome, not a replay", c.name)
		require.NotNil(t, res.Error, c.name)
		require.Equal(t, c.code, res.Error.Code, "%s: %s", c.name, res.Error.Message)
		require.Contains(t, res.Error.Message, c.message, c.name)
	}

	// Bad headers: no reply subject, or one nobody can publish to. There is
	// no one to answer; the intent must still be terminated and the worker
	// must not be harmed.
	badReplyTos := []string{"", "not a subject", "idem.answers.*", "idem.answers.>", "\x00"}
	for _, replyTo := range badReplyTos {
		msg := nats.NewMsg("idem.intents.send_email")
		msg.Data = []byte(`{"tool":"send_email","args":`)
		if replyTo != "" {
			msg.Header.Set(intent.HeaderReplyTo, replyTo)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := js.PublishMsg(ctx, msg)
		cancel()
		require.NoError(t, err, "reply-to %q", replyTo)
	}
	// A good intent whose answer cannot be delivered still fires once.
	bad := nats.NewMsg("idem.intents.send_email")
	bad.Data = []byte(`{"tool":"send_email","args":{"to":"nobody-listens@example.com"}}`)
	bad.Header.Set(intent.HeaderReplyTo, "idem.answers.*")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.PublishMsg(ctx, bad)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return hook.count() == 1 }, 15*time.Second, 20*time.Millisecond)

	// Nothing is left to redeliver and nothing was redelivered.
	requireDrained(t, js, w.log)

	// The worker still serves.
	res := publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":{"to":"after@example.com"}}`))(20 * time.Second)
	require.Equal(t, intent.StatusCompleted, res.Status, "%+v", res)
	require.False(t, res.Replayed)
	require.Equal(t, 2, hook.count(), "only the good intents fired")
	select {
	case <-w.done:
		t.Fatalf("the worker exited: %v", w.err)
	default:
	}
	require.NotContains(t, w.log.String(), "panic")
	requireDrained(t, js, w.log)

	// Every rejected intent is in the dead-letter stream once, unchanged,
	// with the reason it was rejected.
	want := map[string][]string{} // body → codes
	for _, c := range cases {
		want[c.data] = append(want[c.data], c.code)
	}
	for range badReplyTos {
		want[`{"tool":"send_email","args":`] = append(want[`{"tool":"send_email","args":`], intent.CodeInvalidIntent)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dlq, err := js.Stream(ctx, "IDEM_DLQ")
	require.NoError(t, err)
	info, err := dlq.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(cases)+len(badReplyTos), info.State.Msgs, "one dead letter per rejected intent")
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := dlq.GetMsg(ctx, seq)
		require.NoError(t, err)
		body := string(m.Data)
		codes := want[body]
		require.NotEmpty(t, codes, "unexpected dead letter %q", clipBody(body))
		reason := m.Header.Get(intent.HeaderDLQReason)
		i := slices.IndexFunc(codes, func(code string) bool { return strings.HasPrefix(reason, code) })
		require.GreaterOrEqual(t, i, 0, "dead letter %q: reason %q, want one of %v", clipBody(body), reason, codes)
		want[body] = slices.Delete(codes, i, i+1)
		require.True(t, strings.HasPrefix(m.Header.Get(intent.HeaderDLQSubject), "idem.intents."), "original subject kept")
	}
}

func clipBody(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// requireDrained waits until the work stream is empty and the consumer has
// nothing pending, and checks that no intent was ever delivered twice: the
// consumer's delivery sequence (every delivery, redeliveries included)
// equals the stream sequence it has reached.
func requireDrained(t *testing.T, js jetstream.JetStream, log *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var last string
	for {
		cons, err := js.Consumer(ctx, "IDEM_INTENTS", "IDEM_WORKERS")
		require.NoError(t, err)
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		st, err := js.Stream(ctx, "IDEM_INTENTS")
		require.NoError(t, err)
		sinfo, err := st.Info(ctx)
		require.NoError(t, err)
		last = fmt.Sprintf("redelivered=%d ack_pending=%d pending=%d stream_msgs=%d deliveries=%d stream_seq=%d last_seq=%d",
			info.NumRedelivered, info.NumAckPending, info.NumPending, sinfo.State.Msgs,
			info.Delivered.Consumer, info.Delivered.Stream, sinfo.State.LastSeq)
		if info.NumAckPending == 0 && info.NumPending == 0 && sinfo.State.Msgs == 0 && info.Delivered.Stream == sinfo.State.LastSeq {
			require.Zero(t, info.NumRedelivered, last)
			require.Equal(t, info.Delivered.Stream, info.Delivered.Consumer, "an intent was delivered more than once: %s", last)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the work stream did not drain: %s\nworker log:\n%s", last, log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
