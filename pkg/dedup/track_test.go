package dedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// trackBundle is a two-partition ledger, a Tracker of it, and what a whole
// walk of it finds, to compare.
type trackBundle struct {
	ctx     context.Context
	js      jetstream.JetStream
	ledger  *dedup.Ledger
	tracker *dedup.Tracker
	leases  map[string]*dedup.Lease
	untimed []string // the keys Update reported untimed
}

func newTrackBundle(t *testing.T, bucket string) *trackBundle {
	t.Helper()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	js := jetStream(t, s.ClientURL())
	_, _, err := dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: bucket, Partitions: 2})
	require.NoError(t, err)
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: bucket}, dedup.Bind(), dedup.WithForgetRetention(2*time.Hour))
	require.NoError(t, err)
	return &trackBundle{ctx: ctx, js: js, ledger: l, tracker: l.Track(), leases: map[string]*dedup.Lease{}}
}

func (b *trackBundle) claim(t *testing.T, key string, retention time.Duration) {
	t.Helper()
	res, err := b.ledger.Claim(b.ctx, dedup.ClaimRequest{Key: key, Tool: "t", Fingerprint: "fp", Holder: "w1", Lease: time.Minute, Retention: retention})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	b.leases[key] = res.Lease
}

// tracked is what a comparison reads of an unresolved record.
type tracked struct {
	Key                   string
	Revision              uint64
	Status                intent.Status
	UpdatedAt, LeaseUntil time.Time
	Uncertain             *dedup.Listed
}

// walked is what a whole walk finds unresolved, in walk order.
func (b *trackBundle) walked(t *testing.T) []tracked {
	t.Helper()
	var out []tracked
	require.NoError(t, b.ledger.Walk(b.ctx, dedup.Query{Statuses: dedup.OpenStatuses}, func(r dedup.Listed) bool {
		u := tracked{Key: r.Key, Revision: r.Revision, Status: r.Status, UpdatedAt: r.UpdatedAt, LeaseUntil: r.LeaseUntil}
		if r.Status == intent.StatusUncertain {
			u.Uncertain = &r
		}
		out = append(out, u)
		return true
	}))
	return out
}

// update runs an Update and requires the tracker to hold what a walk finds
// unresolved; it returns what the Update read.
func (b *trackBundle) update(t *testing.T, whole bool) dedup.TrackStats {
	t.Helper()
	st, err := b.tracker.Update(b.ctx, func(r dedup.Listed) error {
		b.untimed = append(b.untimed, r.Key)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, whole, st.Whole, "a whole read")
	var got []tracked
	for _, u := range b.tracker.Unresolved() {
		got = append(got, tracked{Key: u.Key, Revision: u.Revision, Status: u.Status, UpdatedAt: u.UpdatedAt, LeaseUntil: u.LeaseUntil, Uncertain: u.Uncertain})
		require.Equal(t, u.Status == intent.StatusPending && !time.Now().Before(u.LeaseUntil), u.PastLease(time.Now()))
	}
	require.Equal(t, b.walked(t), got, "the tracker holds what a walk finds")
	return st
}

// A Tracker reads only what was written since its last Update and holds
// exactly the unresolved records a whole walk finds, after records are
// created, written again (each unresolved state, final), forgotten, deleted,
// purged and expired between Updates; it reads the whole ledger again when
// its stream was made again, when a record it holds left the stream unseen,
// and when its last Update is too old to trust what it read since.
func TestTrackerHoldsWhatAWalkFinds(t *testing.T) {
	t.Parallel()
	b := newTrackBundle(t, "TRACK")
	key := func(i int) string { return fmt.Sprintf("t.k%02d", i) }
	for i := range 30 {
		b.claim(t, key(i), time.Second) // final ones expire a second after
	}
	st := b.update(t, true)
	require.Equal(t, 30, st.Read)
	st = b.update(t, false)
	require.Zero(t, st.Read, "nothing written, nothing read")

	// Each kind of write between two Updates.
	ctx := b.ctx
	_, err := b.leases[key(0)].Complete(ctx, json.RawMessage(`1`), 1)
	require.NoError(t, err)
	_, err = b.leases[key(1)].Fail(ctx, intent.Error{Code: "x", Message: "no"}, 1)
	require.NoError(t, err)
	_, err = b.leases[key(2)].AwaitApproval(ctx, json.RawMessage(`{}`))
	require.NoError(t, err)
	_, err = b.leases[key(3)].Hold(ctx, "unsure")
	require.NoError(t, err)
	require.NoError(t, b.leases[key(4)].Release(ctx, 1))
	_, err = b.leases[key(5)].AwaitApproval(ctx, json.RawMessage(`{}`))
	require.NoError(t, err)
	_, _, err = b.ledger.Approve(ctx, key(5), "fp", "op", "fine", time.Hour)
	require.NoError(t, err)
	_, err = b.leases[key(6)].AwaitApproval(ctx, json.RawMessage(`{}`))
	require.NoError(t, err)
	_, err = b.ledger.Forget(ctx, key(6), dedup.Forced())
	require.NoError(t, err)
	b.claim(t, "t.new", 0)
	st = b.update(t, false)
	require.Equal(t, 8, st.Read, "only what was written since")

	// Written twice between Updates: the latest write counts.
	_, err = b.leases[key(7)].Hold(ctx, "unsure")
	require.NoError(t, err)
	_, _, err = b.ledger.Resolve(ctx, key(7), true, json.RawMessage(`2`), "op", "done")
	require.NoError(t, err)
	// Deleted and purged behind the ledger's back (delete markers).
	kvs, _, err := dedup.BindPartitions(ctx, b.js, "TRACK")
	require.NoError(t, err)
	for _, i := range []int{8, 9} {
		for _, kv := range kvs {
			e, err := kv.Get(ctx, key(i))
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
			require.NoError(t, err)
			if i == 8 {
				require.NoError(t, kv.Delete(ctx, key(i), jetstream.LastRevision(e.Revision())))
			} else {
				require.NoError(t, kv.Purge(ctx, key(i)))
			}
		}
	}
	// Settled, then expired (its TTL a second) before the next Update: its
	// expiry marker tells.
	_, err = b.leases[key(10)].Complete(ctx, json.RawMessage(`1`), 1)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, _, err := b.ledger.Get(ctx, key(10))
		return errors.Is(err, dedup.ErrNotFound)
	}, time.Minute, 50*time.Millisecond, "the final record expires")
	// An untimed final record, as an earlier version wrote it.
	old, err := json.Marshal(dedup.Record{Status: intent.StatusCompleted, Tool: "t", Fingerprint: "fp", Attempt: 1, Attempts: 1,
		Result: json.RawMessage(`1`), CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC(), CompletedAt: time.Now().UTC()})
	require.NoError(t, err)
	p, err := b.partitionOf(ctx, kvs, key(11))
	require.NoError(t, err)
	_, err = kvs[p].Put(ctx, key(11), old)
	require.NoError(t, err)
	// Something else written under a record's key: a walk skips it.
	p, err = b.partitionOf(ctx, kvs, key(12))
	require.NoError(t, err)
	_, err = kvs[p].Put(ctx, key(12), []byte("not a record"))
	require.NoError(t, err)
	b.update(t, false)
	require.Equal(t, []string{key(11)}, b.untimed, "an untimed record is reported")

	// A stream made again (a server that kept it in memory, restarted):
	// its records are gone and its sequences start over.
	require.NoError(t, b.js.DeleteStream(ctx, "KV_"+kvs[0].Bucket()))
	_, _, err = dedup.EnsurePartitions(ctx, b.js, dedup.BucketConfig{Bucket: "TRACK", Partitions: 2})
	require.NoError(t, err)
	for i := range 150 { // past the sequences read of the stream before
		b.claim(t, fmt.Sprintf("t.r%03d", i), 0)
	}
	b.update(t, true)
	b.update(t, false)

	// A record the tracker holds purged from its stream with no marker (by
	// an operator): it lies before the stream's first message.
	var held []string
	for _, u := range b.tracker.Unresolved() {
		held = append(held, u.Key)
	}
	require.NotEmpty(t, held)
	p, err = b.partitionOf(ctx, kvs, held[len(held)-1])
	require.NoError(t, err)
	s, err := b.js.Stream(ctx, "KV_"+kvs[p].Bucket())
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx))
	b.update(t, true)

	// At the latest an hour after the last whole read (the ledger's
	// retention 24h, a forget's two hours: nothing could have expired).
	b.claim(t, "t.long", 0)
	b.update(t, false)
	b.tracker.Backdate(time.Hour)
	b.update(t, true)
	// Too long since the last Update for a record held whose retention is a
	// second: a write of it since may have expired, and its marker gone.
	b.claim(t, "t.short", time.Second)
	b.update(t, false)
	b.tracker.Backdate(2 * time.Minute)
	b.update(t, true)
	b.update(t, false)
}

// partitionOf returns the index of the partition of kvs that holds key.
func (b *trackBundle) partitionOf(ctx context.Context, kvs []jetstream.KeyValue, key string) (int, error) {
	for i, kv := range kvs {
		if _, err := kv.Get(ctx, key); err == nil {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%s is in no partition", key)
}

// What a round of the ledger scan reads on a ledger of n records with
// changed of them written since the last round: every record with a walk,
// the changes with a Tracker.
func TestTrackerReadsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	b := newTrackBundle(t, "TRACKCOST")
	const n, changed = 2000, 20
	for i := range n {
		b.claim(t, fmt.Sprintf("t.k%04d", i), 0)
	}
	walked := 0
	require.NoError(t, b.ledger.Walk(b.ctx, dedup.Query{}, func(dedup.Listed) bool { walked++; return true }))
	first := b.update(t, true)
	for i := range changed {
		_, err := b.leases[fmt.Sprintf("t.k%04d", i)].Complete(b.ctx, json.RawMessage(`1`), 1)
		require.NoError(t, err)
	}
	next := b.update(t, false)
	require.Equal(t, n, walked)
	require.Equal(t, n, first.Read)
	require.Equal(t, changed, next.Read)
	t.Logf("a ledger of %d records, %d written since the last round: a walk reads %d, a Tracker's first Update %d, the next %d",
		n, changed, walked, first.Read, next.Read)
}

// A server restart keeps the ledger's streams (stored on disk) and their
// sequences: the Tracker goes on reading only what was written since,
// including the marker of a record that expired while the server was down.
func TestTrackerAcrossAServerRestart(t *testing.T) {
	t.Parallel()
	var opts *server.Options
	s := natstest.RunServer(t, func(o *server.Options) { opts = o })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nc := natstest.Connect(t, s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "RESTART", Partitions: 2})
	require.NoError(t, err)
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "RESTART"}, dedup.Bind())
	require.NoError(t, err)
	b := &trackBundle{ctx: ctx, js: js, ledger: l, tracker: l.Track(), leases: map[string]*dedup.Lease{}}
	for i := range 10 {
		b.claim(t, fmt.Sprintf("t.k%d", i), time.Second)
	}
	b.update(t, true)
	_, err = b.leases["t.k0"].Complete(ctx, json.RawMessage(`1`), 1) // expires a second later
	require.NoError(t, err)
	_, err = b.leases["t.k1"].Hold(ctx, "unsure")
	require.NoError(t, err)

	opts.Port = s.Addr().(*net.TCPAddr).Port // the clients reconnect to the same address
	s.Shutdown()
	s.WaitForShutdown()
	time.Sleep(1100 * time.Millisecond) // t.k0's TTL runs out while the server is down
	s, err = server.NewServer(opts)
	require.NoError(t, err)
	s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(time.Minute))
	require.Eventually(t, func() bool {
		_, _, err := l.Get(ctx, "t.k0")
		return errors.Is(err, dedup.ErrNotFound)
	}, time.Minute, 20*time.Millisecond, "the ledger is served again, the settled record expired")
	b.claim(t, "t.new", 0)
	b.update(t, false)
}
