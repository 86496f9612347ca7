package dedup_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// listBundle is a ledger over its own bucket, with a clock the test moves.
type listBundle struct {
	ctx    context.Context
	ledger *dedup.Ledger
	kv     jetstream.KeyValue
	layout int
	clock  *atomic.Int64 // unix nanoseconds the ledger reads as now
	names  *sync.Map     // stored key: the key claimed under it
}

// newListBundle makes a one-bucket ledger of the given key layout: a plain
// bucket (EnsureBucket, which records none) for intent.LayoutFull.
func newListBundle(t *testing.T, servers []*server.Server, replicas int, bucket string, layout int) *listBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js := jetStream(t, servers[len(servers)-1].ClientURL()) // a follower's connection on R3
	var kv jetstream.KeyValue
	var err error
	if layout == intent.LayoutFull {
		kv, err = dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: bucket, Replicas: replicas})
	} else {
		var kvs []jetstream.KeyValue
		kvs, layout, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: bucket, Replicas: replicas, Layout: layout})
		if err == nil {
			kv = kvs[0]
		}
	}
	require.NoError(t, err)
	clock := &atomic.Int64{}
	clock.Store(time.Date(2025, 1, 6, 10, 0, 0, 0, time.UTC).UnixNano())
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: bucket}, dedup.Bind(), dedup.WithClock(func() time.Time { return time.Unix(0, clock.Load()) }))
	require.NoError(t, err)
	return &listBundle{ctx: ctx, ledger: l, kv: kv, layout: layout, clock: clock, names: &sync.Map{}}
}

// stored is key's KV key in the bundle's layout.
func (b *listBundle) stored(t *testing.T, key string) string {
	t.Helper()
	sk, err := intent.LedgerKey(key, b.layout)
	require.NoError(t, err)
	return sk
}

func (b *listBundle) advance(d time.Duration) { b.clock.Add(int64(d)) }

// claim claims key for tool in session, with a one-minute lease.
func (b *listBundle) claim(t *testing.T, key, tool, session string) *dedup.Lease {
	t.Helper()
	b.names.Store(b.stored(t, key), key)
	res, err := b.ledger.Claim(b.ctx, dedup.ClaimRequest{Key: key, Tool: tool, Session: session, Fingerprint: "fp-" + key, Holder: "w1", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	return res.Lease
}

// all pages through q with pages of limit and returns every key found and
// the number of pages.
func (b *listBundle) all(t *testing.T, q dedup.Query) ([]string, int) {
	t.Helper()
	var keys []string
	pages := 0
	for {
		page, err := b.ledger.List(b.ctx, q)
		require.NoError(t, err)
		pages++
		for i, r := range page.Records {
			key := r.Key
			if k, ok := b.names.Load(key); ok {
				key = k.(string) // the listing shows stored keys: compare the claimed ones
			}
			keys = append(keys, key)
			if i > 0 {
				require.Greater(t, r.Revision, page.Records[i-1].Revision, "stream order")
			}
			require.LessOrEqual(t, r.Revision, page.Next)
		}
		if !page.More {
			return keys, pages
		}
		require.Greater(t, page.Next, q.After, "the cursor moves on")
		q.After = page.Next
		require.Less(t, pages, 100, "paging does not end")
	}
}

// settled waits until a listing of q finds exactly want: on a replicated
// bucket the listing's consumer may sit on a replica that applies an
// acknowledged write a moment later. It waits until the test's deadline
// (less a tenth, to report), not a fixed time: a loaded machine's replica
// may lag for seconds.
func (b *listBundle) settled(t *testing.T, q dedup.Query, want []string) {
	t.Helper()
	wait := 10 * time.Second // without a deadline (go test -timeout 0)
	if d, ok := t.Deadline(); ok {
		wait = time.Until(d) * 9 / 10
	}
	require.Eventually(t, func() bool {
		got, _ := b.all(t, q)
		return assert.ElementsMatch(noFail{}, want, got)
	}, wait, 10*time.Millisecond, "the listing settles on %v", want)
}

// noFail is an assert.TestingT that only reports the result.
type noFail struct{}

func (noFail) Errorf(string, ...any) {}

// The listing pages through every live record in stream order, under its
// operation's key, filters by status, tool, session, age and expired lease,
// skips delete markers, and bounds a page's scan: on one server (R1) and on
// a 3-node cluster (R3) with compact keys, and on one server with keys
// stored as they are.
func TestList(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		be     backend
		layout int
	}{{backends[0], intent.LayoutCompact}, {backends[1], intent.LayoutCompact}, {backends[0], intent.LayoutFull}} {
		be := c.be
		t.Run(fmt.Sprintf("%s/Layout%d", be.name, c.layout), func(t *testing.T) {
			t.Parallel()
			b := newListBundle(t, be.start(t), be.replicas, "LIST_TEST", c.layout)

			// 30 records: 20 of send_email, 10 of refund; sessions a and b;
			// the first 10 an hour older than the rest.
			var keys []string
			leases := map[string]*dedup.Lease{}
			for i := range 30 {
				tool, session := "send_email", "a"
				if i%3 == 2 {
					tool = "refund"
				}
				if i%2 == 1 {
					session = "b"
				}
				key := partKey(tool, i)
				keys = append(keys, key)
				leases[key] = b.claim(t, key, tool, session)
				if i == 9 {
					b.advance(time.Hour)
				}
			}
			// Complete every send_email record whose index is a multiple of 4.
			completed := map[string]bool{}
			for i, k := range keys {
				if i%4 == 0 && k[:4] == "send" {
					_, err := leases[k].Complete(b.ctx, json.RawMessage(`{"ok":true}`), 1)
					require.NoError(t, err)
					completed[k] = true
				}
			}

			b.settled(t, dedup.Query{}, keys)
			got, pages := b.all(t, dedup.Query{Limit: 7})
			require.ElementsMatch(t, keys, got, "every live record once")
			require.Equal(t, 5, pages, "30 records in pages of 7")
			page, err := b.ledger.List(b.ctx, dedup.Query{})
			require.NoError(t, err)
			require.Len(t, page.Records, 30)
			require.False(t, page.More)
			for _, r := range page.Records {
				if r.Key == keys[3] {
					require.Equal(t, "b", r.Session, "the record carries the session")
					require.Equal(t, "send_email", r.Tool)
				}
			}

			// Delete markers (an operator's delete, a forget) are skipped.
			require.NoError(t, b.kv.Delete(b.ctx, b.stored(t, keys[1])))
			_, err = b.ledger.Forget(b.ctx, keys[0]) // completed: may be forgotten
			require.NoError(t, err)
			b.settled(t, dedup.Query{Limit: 4}, keys[2:])
			live := keys[2:]

			var want []string
			for _, k := range live {
				if completed[k] {
					want = append(want, k)
				}
			}
			got, _ = b.all(t, dedup.Query{Statuses: []intent.Status{intent.StatusCompleted}, Limit: 2})
			require.ElementsMatch(t, want, got, "status filter")

			want = nil
			for _, k := range live {
				if k[:6] == "refund" {
					want = append(want, k)
				}
			}
			got, _ = b.all(t, dedup.Query{Tool: "refund", Limit: 3})
			require.ElementsMatch(t, want, got, "tool filter")
			page, err = b.ledger.List(b.ctx, dedup.Query{Tool: "refund", MaxScan: 2})
			require.NoError(t, err)
			require.Len(t, page.Records, 2, "the tool filter is applied by the server: every record read matches")

			want = nil
			for i, k := range keys {
				if i >= 2 && i%2 == 1 {
					want = append(want, k)
				}
			}
			got, _ = b.all(t, dedup.Query{Session: "b", Limit: 5})
			require.ElementsMatch(t, want, got, "session filter")

			got, _ = b.all(t, dedup.Query{CreatedBefore: time.Date(2025, 1, 6, 10, 30, 0, 0, time.UTC)})
			require.ElementsMatch(t, keys[2:10], got, "age filter: the first ten are an hour older")

			// Past its lease: a minute and a half later the ten young pending
			// records of the last batch are past it; completing one of them
			// takes it out.
			got, _ = b.all(t, dedup.Query{PastLease: true})
			var old []string
			for _, k := range keys[2:10] {
				if !completed[k] {
					old = append(old, k)
				}
			}
			require.ElementsMatch(t, old, got, "only the older claims are past their lease")
			b.advance(90 * time.Second)
			got, _ = b.all(t, dedup.Query{PastLease: true, Statuses: dedup.OpenStatuses})
			var open []string
			for _, k := range live {
				if !completed[k] {
					open = append(open, k)
				}
			}
			require.ElementsMatch(t, open, got)

			// A selective filter with a scan bound: short pages, each with
			// More, until the end.
			page, err = b.ledger.List(b.ctx, dedup.Query{Session: "nobody", MaxScan: 10})
			require.NoError(t, err)
			require.Empty(t, page.Records)
			require.True(t, page.More, "the scan stopped at its bound")
			got, pages = b.all(t, dedup.Query{Session: "nobody", MaxScan: 10})
			require.Empty(t, got)
			require.Equal(t, 3, pages, "28 records, 10 per scan")

			// A record written again moves to the end of the stream: a
			// listing past the old cursor sees it there.
			page, err = b.ledger.List(b.ctx, dedup.Query{})
			require.NoError(t, err)
			cursor := page.Next
			_, err = leases[keys[29]].Complete(b.ctx, json.RawMessage(`{}`), 1)
			require.NoError(t, err)
			b.settled(t, dedup.Query{After: cursor}, keys[29:])
			page, err = b.ledger.List(b.ctx, dedup.Query{After: cursor})
			require.NoError(t, err)
			require.Len(t, page.Records, 1)
			require.Equal(t, b.stored(t, keys[29]), page.Records[0].Key, "a listing shows the stored key")
			require.Equal(t, intent.StatusCompleted, page.Records[0].Status)
			page, err = b.ledger.List(b.ctx, dedup.Query{After: page.Next})
			require.NoError(t, err)
			require.Empty(t, page.Records)
			require.False(t, page.More)

			for _, q := range []dedup.Query{{Limit: -1}, {Limit: dedup.MaxListLimit + 1}, {Tool: "Bad.Tool"}, {Statuses: []intent.Status{"done"}}, {MaxScan: -1}} {
				_, err := b.ledger.List(b.ctx, q)
				require.ErrorIs(t, err, dedup.ErrInvalid, "%+v", q)
			}
		})
	}
}

// Walk visits every record a listing selects, reading each partition with
// one consumer however many records it holds (a listing makes one per
// page, and each makes the server count every key of its partition), and
// stops when told.
func TestWalkReadsEachPartitionWithOneConsumer(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js := jetStream(t, s.ClientURL())
	_, layout, err := dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "WALK", Partitions: 2})
	require.NoError(t, err)
	// The consumers' create requests, which a subscriber in the account
	// sees beside the JetStream API.
	var creates atomic.Int32
	watcher := natstest.Connect(t, s.ClientURL())
	_, err = watcher.Subscribe("$JS.API.CONSUMER.CREATE.>", func(*nats.Msg) { creates.Add(1) })
	require.NoError(t, err)
	require.NoError(t, watcher.Flush())
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "WALK"}, dedup.Bind())
	require.NoError(t, err)
	const n = 2*dedup.MaxListLimit + 500 // several pages' worth in each partition
	want := make([]string, 0, n)
	for i := range n {
		key := fmt.Sprintf("t.%x", sha256.Sum256(fmt.Appendf(nil, "%d", i)))
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		stored, err := intent.LedgerKey(key, layout) // what a listing shows
		require.NoError(t, err)
		want = append(want, stored)
	}

	var got []string
	creates.Store(0)
	require.NoError(t, l.Walk(ctx, dedup.Query{}, func(r dedup.Listed) bool {
		got = append(got, r.Key)
		return true
	}))
	require.ElementsMatch(t, want, got)
	require.NoError(t, watcher.Flush())
	require.Equal(t, int32(2), creates.Load(), "one consumer per partition")

	got = got[:0]
	require.NoError(t, l.Walk(ctx, dedup.Query{Statuses: []intent.Status{intent.StatusCompleted}}, func(r dedup.Listed) bool {
		got = append(got, r.Key)
		return true
	}))
	require.Empty(t, got, "the query selects")

	got = got[:0]
	require.NoError(t, l.Walk(ctx, dedup.Query{}, func(r dedup.Listed) bool {
		got = append(got, r.Key)
		return len(got) < 10
	}))
	require.Len(t, got, 10, "false stops the walk")

	err = l.Walk(ctx, dedup.Query{Tool: "Not A Tool"}, func(dedup.Listed) bool { return true })
	require.ErrorIs(t, err, dedup.ErrInvalid)
}
