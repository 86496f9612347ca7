package dedup_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// inProcessRefusal is what a replicated stream answers a write of a key
// expecting its last sequence while another write of the key is in process
// (10164): nothing says the key moved.
const inProcessRefusal = `{"error":{"code":400,"err_code":10164,"description":"wrong last sequence"}}`

// A write refused while the record is still at the lease's revision — the
// refusal a replicated stream gives while an earlier write of the key, most
// likely the holder's own of unknown outcome, is in process — leaves the
// lease held: the holder tries again and records its outcome, instead of
// taking the lease for lost and leaving the key to expire and fire again.
func TestRefusalWhileAWriteIsInProcessKeepsTheLease(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct := jetStream(t, s.ClientURL())
	_, err := dedup.EnsureBucket(ctx, direct, dedup.BucketConfig{Bucket: "INPROCESS"})
	require.NoError(t, err)

	// The ledger's connection reaches JetStream through a relay on the API
	// prefix FAULT, which answers the next refuse writes of a key itself (the
	// ledger retries such a refusal for a while).
	var refuse atomic.Int32
	js := relayed(t, s, "FAULT", func(subject string, m *nats.Msg) bool {
		if strings.HasPrefix(subject, "$KV.") && refuse.Add(-1) >= 0 {
			_ = m.Respond([]byte(inProcessRefusal))
			return true
		}
		return false
	})
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "INPROCESS"}, dedup.Bind())
	require.NoError(t, err)
	t.Cleanup(l.Close)

	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: "k.1", Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)

	refuse.Store(20) // a write in process for a while (a loaded server)
	require.NoError(t, res.Lease.Extend(ctx, time.Minute), "retried until the write in process is over")
	refuse.Store(1 << 20) // a write in process for longer than the retries
	err = res.Lease.Extend(ctx, time.Minute)
	require.Error(t, err, "the refused write did not land")
	require.NotErrorIs(t, err, dedup.ErrLeaseLost, "nobody else wrote: the lease is not lost")
	_, err = res.Lease.Complete(ctx, json.RawMessage(`"done"`), 1)
	require.NotErrorIs(t, err, dedup.ErrLeaseLost)

	refuse.Store(0) // the write in process is over
	rec, err := res.Lease.Complete(ctx, json.RawMessage(`"done"`), 1)
	require.NoError(t, err, "tried again, the outcome is recorded")
	require.Equal(t, json.RawMessage(`"done"`), rec.Result)
	got, _, err := l.Get(ctx, "k.1")
	require.NoError(t, err)
	require.Equal(t, rec.Status, got.Status)
}

// relayed returns a JetStream context whose requests reach s through a relay
// on the API prefix prefix: answer sees each request first (its subject
// without the prefix) and, when it answers it itself, returns true; the
// others go on to the server.
func relayed(t *testing.T, s *server.Server, prefix string, answer func(subject string, m *nats.Msg) bool) jetstream.JetStream {
	t.Helper()
	relay := natstest.Connect(t, s.ClientURL())
	_, err := relay.Subscribe(prefix+".>", func(m *nats.Msg) {
		subject := strings.TrimPrefix(m.Subject, prefix+".")
		if answer(subject, m) {
			return
		}
		if !strings.HasPrefix(subject, "$KV.") {
			subject = "$JS.API." + subject
		}
		resp, err := relay.RequestMsg(&nats.Msg{Subject: subject, Header: m.Header, Data: m.Data}, 5*time.Second)
		if err == nil {
			_ = m.RespondMsg(&nats.Msg{Header: resp.Header, Data: resp.Data})
		}
	})
	require.NoError(t, err)
	require.NoError(t, relay.Flush(), "the relay is subscribed before the first request")
	js, err := jetstream.NewWithAPIPrefix(natstest.Connect(t, s.ClientURL()), prefix)
	require.NoError(t, err)
	return js
}
