package client_test

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A duplicate of an operation already recorded is answered from one read
// of its key: no watch. A duplicate of one still in flight watches the key
// (a subscription to its subject and leader reads) and gets the answer
// once it is recorded. Neither creates a consumer on the ledger's stream:
// the server would deliver one's messages wherever its creator named.
func TestDuplicateWatchesOnlyWhileNoRecordAnswers(t *testing.T) {
	t.Parallel()
	b := setupAnswers(t)
	// Every consumer created on the ledger's stream, and every leader read
	// of it, is a request to the JetStream API, which a subscriber in the
	// account sees too, in order with the test's own messages.
	creates := make(chan *nats.Msg, 16)
	_, err := b.nc.ChanSubscribe("$JS.API.CONSUMER.CREATE.KV_IDEM_LEDGER.>", creates)
	require.NoError(t, err)
	reads := make(chan *nats.Msg, 64)
	_, err = b.nc.ChanSubscribe("$JS.API.STREAM.MSG.GET.KV_IDEM_LEDGER", reads)
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())

	record := func(s *client.Submission, result string) dedup.ClaimResult {
		t.Helper()
		c, err := b.ledger.Claim(b.ctx, dedup.ClaimRequest{Key: s.Key, Tool: "send", Fingerprint: s.Fingerprint,
			Holder: "w1", IntentSeq: s.Sequence})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, c.Outcome)
		if result != "" {
			_, err = c.Lease.Complete(b.ctx, json.RawMessage(result), 1)
			require.NoError(t, err)
		}
		return c
	}

	// Recorded.
	first, _ := b.publish(t, `{"tool":"send","args":{"to":"ada"}}`)
	record(first, `{"n":1}`)
	dup, _ := b.publish(t, `{"tool":"send","args":{"to":"ada"}}`)
	require.True(t, dup.Duplicate)
	res, err := dup.Wait(b.ctx)
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.True(t, res.Replayed)
	require.JSONEq(t, `{"n":1}`, string(res.Result))
	require.NoError(t, b.nc.Flush())
	require.Len(t, creates, 0, "the recorded answer was read, not watched: no consumer created")

	// In flight: claimed, not yet recorded.
	second, _ := b.publish(t, `{"tool":"send","args":{"to":"bob"}}`)
	c := record(second, "")
	dup, _ = b.publish(t, `{"tool":"send","args":{"to":"bob"}}`)
	require.True(t, dup.Duplicate)
	for len(reads) > 0 {
		<-reads // the ones before the watch
	}
	answered := make(chan *intent.Result, 1)
	go func() {
		res, err := dup.Wait(b.ctx)
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		answered <- res
	}()
	select {
	case <-reads: // the key is watched: subscribed, then read from the leader
	case m := <-creates:
		t.Fatalf("the in-flight key was watched by a consumer on the ledger's stream: %s %s", m.Subject, m.Data)
	case res := <-answered:
		t.Fatalf("answered before the operation was recorded: %+v", res)
	case <-b.ctx.Done():
		t.Fatal("the in-flight operation's key was not watched")
	}
	_, err = c.Lease.Complete(b.ctx, json.RawMessage(`{"n":2}`), 1)
	require.NoError(t, err)
	res = <-answered
	require.NotNil(t, res)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.True(t, res.Replayed)
	require.JSONEq(t, `{"n":2}`, string(res.Result))
	require.NoError(t, b.nc.Flush())
	require.Len(t, creates, 0, "the in-flight key was watched without a consumer")
}
