package client_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// answerBundle is a stream and a ledger with no worker: the test answers
// the submissions itself, on their inboxes, as a worker or a forger would.
type answerBundle struct {
	ctx     context.Context
	nc      *nats.Conn // the test's own connection: the forger's and the "worker's"
	cl      *client.Client
	ledger  *dedup.Ledger
	inboxes chan *nats.Msg // every intent published, with its Idem-Reply-To
}

func setupAnswers(t *testing.T) *answerBundle {
	t.Helper()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	nc := natstest.Connect(t, s.ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDEM_INTENTS", Subjects: []string{"idem.intents.>", "idem.control.>"},
		Retention: jetstream.WorkQueuePolicy, Duplicates: time.Minute})
	require.NoError(t, err)
	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{})
	require.NoError(t, err)
	b := &answerBundle{ctx: ctx, nc: nc, ledger: ledger, inboxes: make(chan *nats.Msg, 16)}
	_, err = nc.ChanSubscribe("idem.intents.>", b.inboxes)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	b.cl, err = client.New(natstest.Connect(t, s.ClientURL()), client.WithKeySpec("send", intent.KeySpec{}),
		client.WithReplyGrace(time.Hour)) // no ledger watch unless a duplicate needs one
	require.NoError(t, err)
	return b
}

// publish submits env and returns the submission with the inbox its intent
// named.
func (b *answerBundle) publish(t *testing.T, env string) (*client.Submission, string) {
	t.Helper()
	e, err := intent.Decode([]byte(env), intent.Limits{})
	require.NoError(t, err)
	s, err := b.cl.Publish(b.ctx, e)
	require.NoError(t, err)
	select {
	case m := <-b.inboxes:
		return s, m.Header.Get(intent.HeaderReplyTo)
	case <-b.ctx.Done():
		t.Fatal("the intent was not seen")
		return nil, ""
	}
}

// push publishes res on inbox, with Idem-Intent-Seq seq unless it is "".
func (b *answerBundle) push(t *testing.T, inbox, seq string, res intent.Result) {
	t.Helper()
	m := nats.NewMsg(inbox)
	m.Data, _ = json.Marshal(res)
	if seq != "" {
		m.Header.Set(intent.HeaderIntentSeq, seq)
	}
	require.NoError(t, b.nc.PublishMsg(m))
}

// A pushed answer counts only when its Idem-Intent-Seq is the stream
// sequence of the submission's own stored publish (docs/protocol.md 7.1):
// without the header, with another sequence, or bound to the publish but
// naming another operation or, not replayed, another run, it is dropped, and the submission goes on
// waiting for its own. A rejection bound to the publish counts whatever
// key it names (a worker may reject before it derives one).
func TestPushedAnswersAreBoundToTheOwnPublish(t *testing.T) {
	t.Parallel()
	b := setupAnswers(t)
	s, inbox := b.publish(t, `{"tool":"send","args":{"to":"ada"}}`)
	require.False(t, s.Duplicate)
	own := strconv.FormatUint(s.Sequence, 10)
	completed := func(result string) intent.Result {
		return intent.Result{Key: s.Key, Tool: "send", Status: intent.StatusCompleted, Fingerprint: s.Fingerprint,
			Result: json.RawMessage(result)}
	}
	noFingerprint := completed(`{"forged":"no header, no fingerprint"}`)
	noFingerprint.Fingerprint = ""
	b.push(t, inbox, "", noFingerprint)
	b.push(t, inbox, "", completed(`{"forged":"no header"}`))
	b.push(t, inbox, "x", completed(`{"forged":"not a number"}`))
	b.push(t, inbox, strconv.FormatUint(s.Sequence+1, 10), completed(`{"forged":"another message"}`))
	other := completed(`{"forged":"another operation"}`)
	other.Key = "send." + strings.Repeat("0", 64)
	b.push(t, inbox, own, other)
	otherArgs := completed(`{"forged":"other arguments"}`)
	otherArgs.Fingerprint = strings.Repeat("e", 64)
	b.push(t, inbox, own, otherArgs)
	otherRun := completed(`{"forged":"another run's answer, not replayed"}`)
	otherRun.IntentSeq = s.Sequence + 100
	b.push(t, inbox, own, otherRun)
	require.NoError(t, b.nc.Publish(inbox, []byte("not json")))
	b.push(t, inbox, own, completed(`{"real":true}`))
	res, err := s.Wait(b.ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"real":true}`, string(res.Result), "the answer bound to the publish, after every other was dropped")
	require.False(t, res.Replayed)

	rejected, inbox := b.publish(t, `{"tool":"send","args":{"to":"bob"}}`)
	b.push(t, inbox, strconv.FormatUint(s.Sequence, 10), intent.Result{Status: intent.StatusRejected,
		Error: &intent.Error{Code: intent.CodeInvalidIntent, Message: "another caller's garbage"}})
	b.push(t, inbox, strconv.FormatUint(rejected.Sequence, 10), intent.Result{Tool: "send", Status: intent.StatusRejected,
		Error: &intent.Error{Code: intent.CodeRateLimited, Message: "own"}})
	res, err = rejected.Wait(b.ctx)
	require.NoError(t, err)
	require.Equal(t, "own", res.Error.Message, "a rejection bound to the publish counts, keyless")
}

// A publish JetStream acknowledged as a Duplicate names the earlier
// message's sequence, which is another caller's: an answer bound to it is
// not this submission's, which is answered from the ledger (a replay).
func TestAnswerToTheDuplicatesSequenceIsDropped(t *testing.T) {
	t.Parallel()
	b := setupAnswers(t)
	env := `{"tool":"send","args":{"to":"ada"}}`
	first, _ := b.publish(t, env)
	dup, inbox := b.publish(t, env)
	require.True(t, dup.Duplicate)
	require.Equal(t, first.Sequence, dup.Sequence)

	b.push(t, inbox, strconv.FormatUint(dup.Sequence, 10), intent.Result{Key: dup.Key, Tool: "send", Status: intent.StatusCompleted,
		Fingerprint: dup.Fingerprint, Result: json.RawMessage(`{"forged":true}`)})
	require.NoError(t, b.nc.Flush())
	c, err := b.ledger.Claim(b.ctx, dedup.ClaimRequest{Key: first.Key, Tool: "send", Fingerprint: first.Fingerprint,
		Holder: "w1", IntentSeq: first.Sequence})
	require.NoError(t, err)
	_, err = c.Lease.Complete(b.ctx, json.RawMessage(`{"recorded":true}`), 1)
	require.NoError(t, err)
	res, err := dup.Wait(b.ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"recorded":true}`, string(res.Result), "the ledger's answer, not the pushed one")
	require.True(t, res.Replayed, "another call's outcome")
}

// An operator's decision takes only the answer bound to the decision's own
// message.
func TestDecisionAnswerIsBoundToTheDecision(t *testing.T) {
	t.Parallel()
	b := setupAnswers(t)
	decisions := make(chan *nats.Msg, 1)
	_, err := b.nc.ChanSubscribe("idem.control.>", decisions)
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())
	meta, err := jetstream.New(b.nc)
	require.NoError(t, err)
	stream, err := meta.Stream(b.ctx, "IDEM_INTENTS")
	require.NoError(t, err)
	before, err := stream.Info(b.ctx)
	require.NoError(t, err)
	answered := make(chan *intent.Result, 1)
	go func() {
		res, err := b.cl.Decide(b.ctx, intent.ControlDeny, intent.Control{Key: "send." + strings.Repeat("a", 64), By: "ops"})
		if !assert.NoError(t, err) {
			res = nil
		}
		answered <- res
	}()
	var m *nats.Msg
	select {
	case m = <-decisions:
	case <-b.ctx.Done():
		t.Fatal("no decision published")
	}
	// The subscription may see the decision before the stream stores it:
	// its sequence is the stream's next once the stream has it.
	var info *jetstream.StreamInfo
	wait := time.Minute
	if dl, ok := t.Deadline(); ok {
		wait = time.Until(dl) * 9 / 10
	}
	require.Eventually(t, func() bool {
		info, err = stream.Info(b.ctx)
		return err == nil && info.State.LastSeq > before.State.LastSeq
	}, wait, 10*time.Millisecond, "the decision is stored")
	require.Equal(t, before.State.LastSeq+1, info.State.LastSeq, "the decision is the only message stored")
	own := strconv.FormatUint(info.State.LastSeq, 10)
	inbox := m.Header.Get(intent.HeaderReplyTo)
	denied := func(msg string) intent.Result {
		return intent.Result{Status: intent.StatusDenied, Error: &intent.Error{Code: intent.CodeDenied, Message: msg}}
	}
	b.push(t, inbox, "", denied("forged: no header"))
	b.push(t, inbox, strconv.FormatUint(info.State.LastSeq+1, 10), denied("forged: another message"))
	b.push(t, inbox, own, denied("own"))
	res := <-answered
	require.NotNil(t, res)
	require.Equal(t, "own", res.Error.Message)
}
