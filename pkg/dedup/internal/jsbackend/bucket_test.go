package jsbackend_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The contract the ledger relies on (see the package documentation), on a
// single server and on a 3-node cluster, each writing one write at a time
// and group-committed: the ledger's conformance suite (package dedup) runs
// the ledger over it; this runs the bucket alone.
func TestBucketContract(t *testing.T) {
	t.Parallel()
	for _, backend := range []struct {
		name     string
		replicas int
		start    func(t *testing.T) []*server.Server
	}{
		{"R1", 1, func(t *testing.T) []*server.Server { return []*server.Server{natstest.RunServer(t)} }},
		{"R3", 3, func(t *testing.T) []*server.Server { return natstest.RunCluster(t, 3) }},
	} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			servers := backend.start(t)
			for _, mode := range []struct {
				name     string
				batching *jsbackend.Batching
			}{
				{"Alone", nil},
				{"Grouped", &jsbackend.Batching{Max: 100, Min: 1, InFlight: 2, AckWait: 30 * time.Second}},
			} {
				t.Run(mode.name, func(t *testing.T) {
					t.Parallel()
					name := "CONTRACT_" + mode.name
					ctx := t.Context()
					js, err := jetstream.New(natstest.Connect(t, servers[len(servers)-1].ClientURL()), jetstream.WithDefaultTimeout(time.Minute))
					require.NoError(t, err)
					kv, err := jsbackend.Ensure(ctx, js, jsbackend.Settings{Name: name, Replicas: backend.replicas,
						Storage: jetstream.FileStorage, AtomicPublish: true, MaxConsumers: 100})
					require.NoError(t, err)
					b := jsbackend.New(js, kv, mode.batching)
					t.Cleanup(b.Close)
					for _, tc := range contract {
						t.Run(tc.name, func(t *testing.T) {
							t.Parallel()
							tc.run(t, ctx, b, "k."+tc.name, backend.replicas > 1)
						})
					}
				})
			}
		})
	}
}

var contract = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool)
}{
	{"CreateOnce", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		rev, _, err := b.Create(ctx, key, []byte("one"))
		require.NoError(t, err)
		require.NotZero(t, rev)
		again, latest, err := b.Create(ctx, key, []byte("two"))
		require.ErrorIs(t, err, jsbackend.ErrExists)
		require.Zero(t, again)
		require.Equal(t, jsbackend.Entry{Rev: rev, Data: []byte("one")}, latest, "the refusal returns what holds the key")
		e, err := b.Read(ctx, key)
		require.NoError(t, err)
		require.Equal(t, jsbackend.Entry{Rev: rev, Data: []byte("one")}, e, "the refused write wrote nothing")
	}},
	{"UpdateIsCompareAndSet", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		rev, _, err := b.Create(ctx, key, []byte("one"))
		require.NoError(t, err)
		for _, m := range []jsbackend.Mode{jsbackend.Grouped, jsbackend.Alone} {
			next, err := b.Update(ctx, key, []byte(fmt.Sprint("after ", rev)), rev, 0, m)
			require.NoError(t, err)
			require.Greater(t, next, rev, "revisions only grow")
			_, err = b.Update(ctx, key, []byte("stale"), rev, 0, m)
			require.ErrorIs(t, err, jsbackend.ErrRevision)
			e, err := b.Read(ctx, key)
			require.NoError(t, err)
			require.Equal(t, jsbackend.Entry{Rev: next, Data: []byte(fmt.Sprint("after ", rev))}, e)
			rev = next
		}
	}},
	{"DeleteThenCreateOverTheMarker", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		rev, _, err := b.Create(ctx, key, []byte("one"))
		require.NoError(t, err)
		require.ErrorIs(t, b.Delete(ctx, key, rev+1000), jsbackend.ErrRevision)
		require.NoError(t, b.Delete(ctx, key, rev))
		marker, err := b.Read(ctx, key)
		require.NoError(t, err)
		require.True(t, marker.Deleted)
		require.False(t, marker.Live())
		require.Greater(t, marker.Rev, rev)
		rev, latest, err := b.Create(ctx, key, []byte("two"))
		if err != nil {
			// Refused, the marker returned: written over it by
			// compare-and-set.
			require.ErrorIs(t, err, jsbackend.ErrExists)
			require.Equal(t, marker.Rev, latest.Rev)
			require.True(t, latest.Deleted)
			rev, err = b.Update(ctx, key, []byte("two"), latest.Rev, 0, jsbackend.Grouped)
			require.NoError(t, err)
		}
		e, err := b.Read(ctx, key)
		require.NoError(t, err)
		require.Equal(t, jsbackend.Entry{Rev: rev, Data: []byte("two")}, e)
	}},
	{"NoMessage", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		e, err := b.Read(ctx, key)
		require.NoError(t, err)
		require.Equal(t, jsbackend.Entry{}, e)
		_, err = b.Update(ctx, key, []byte("x"), 1, 0, jsbackend.Grouped)
		require.ErrorIs(t, err, jsbackend.ErrRevision)
		_, _, err = b.Create(ctx, "not a key", []byte("x"))
		require.ErrorIs(t, err, jetstream.ErrInvalidKey)
	}},
	{"WatchSeesEveryWrite", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		rev, _, err := b.Create(ctx, key, []byte("one"))
		require.NoError(t, err)
		w, err := b.Watch(ctx, key)
		require.NoError(t, err)
		defer w.Stop()
		next := func() (jsbackend.Entry, bool) {
			t.Helper()
			u, open := <-w.Updates()
			require.True(t, open)
			return jsbackend.Observed(u)
		}
		// The latest message first, then the end of the initial messages. A
		// watch served by a replica that has not yet the message ends its
		// initial messages first, and delivers the message when it comes.
		var initial []jsbackend.Entry
		for seenOne, ended := false, false; !seenOne || !ended; {
			e, ok := next()
			if !ok {
				require.False(t, ended, "the initial messages end once")
				ended = true
				initial = append(initial, jsbackend.Entry{})
				continue
			}
			require.Equal(t, jsbackend.Entry{Rev: rev, Data: []byte("one")}, e)
			require.False(t, seenOne, "the message once")
			seenOne = true
			initial = append(initial, e)
		}
		if !replicated {
			require.Equal(t, []jsbackend.Entry{{Rev: rev, Data: []byte("one")}, {}}, initial, "the latest message, then the end")
		}
		rev, err = b.Update(ctx, key, []byte("two"), rev, 0, jsbackend.Grouped)
		require.NoError(t, err)
		e, _ := next()
		require.Equal(t, jsbackend.Entry{Rev: rev, Data: []byte("two")}, e)
		require.NoError(t, b.Delete(ctx, key, rev))
		e, _ = next()
		require.True(t, e.Deleted)
	}},
	{"ScanPagesThroughLiveRecords", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		token := "scan" + fmt.Sprint(time.Now().UnixNano())
		var want []string
		var gone uint64
		for i := range 5 {
			k := token + "." + fmt.Sprint(i)
			rev, _, err := b.Create(ctx, k, []byte(k))
			require.NoError(t, err)
			if i == 2 {
				require.NoError(t, b.Delete(ctx, k, rev))
				gone = rev
				continue
			}
			want = append(want, k)
		}
		_, err := b.Update(ctx, want[0], []byte("final"), mustRead(t, ctx, b, want[0]).Rev, time.Hour, jsbackend.Grouped)
		require.NoError(t, err)
		want = append(want[1:], want[0]) // written again: at the end, with its TTL

		// A scan of a replicated bucket may be served by a replica that has
		// not yet every acknowledged write: it shows them once it has.
		settled(t, ctx, replicated, func() error {
			var got []string
			var ttls []time.Duration
			s := jsbackend.Scan{Token: token, Limit: 2}
			for pages := 0; ; pages++ {
				require.Less(t, pages, 10, "paging ends")
				next, read, more, err := b.Scan(ctx, s, func(m jsbackend.Msg) bool {
					require.NotEqual(t, gone, m.Rev, "a marker is passed over")
					got = append(got, m.Key)
					ttls = append(ttls, m.TTL)
					return true
				})
				require.NoError(t, err)
				if read == 0 {
					return errors.New("a page read nothing")
				}
				if !more {
					break
				}
				require.Greater(t, next, s.After, "the cursor moves on")
				s.After = next
			}
			if !slices.Equal(want, got) {
				return fmt.Errorf("every live record once, in the order of its last write: want %q, got %q", want, got)
			}
			require.Equal(t, time.Hour, ttls[len(ttls)-1])
			require.Zero(t, ttls[0])
			return nil
		})

		// The token's messages now: 1, the marker of 2, 3, 4, 0.
		settled(t, ctx, replicated, func() error {
			visited := 0
			_, read, more, err := b.Scan(ctx, jsbackend.Scan{Token: token, Limit: 1, MaxScan: 2}, func(jsbackend.Msg) bool { visited++; return false })
			require.NoError(t, err)
			if read != 2 || !more || visited != 1 {
				return fmt.Errorf("a scan bound stops the scan (read %d, more %v); the marker is read, not visited (visited %d)", read, more, visited)
			}
			return nil
		})
	}},
	{"PlaceAndPurge", func(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string, replicated bool) {
		placed, err := b.Place(ctx, key, []byte("moved"), time.Hour)
		require.NoError(t, err)
		require.True(t, placed)
		placed, err = b.Place(ctx, key, []byte("again"), time.Hour)
		require.NoError(t, err)
		require.False(t, placed, "a record there already stays")
		require.Equal(t, []byte("moved"), mustRead(t, ctx, b, key).Data)
		require.NoError(t, b.Delete(ctx, key, mustRead(t, ctx, b, key).Rev))
		placed, err = b.Place(ctx, key, []byte("over"), 0)
		require.NoError(t, err)
		require.True(t, placed, "a delete marker is written over")
		require.NoError(t, b.Purge(ctx, key))
		require.Equal(t, jsbackend.Entry{}, mustRead(t, ctx, b, key), "nothing left, not even a marker")
	}},
}

// settled runs check until it returns nil: once on a single server, where
// it must pass at once, and again after a pause on a replicated bucket,
// whose replica may not have caught up yet, until ctx ends or the test's
// deadline nears (then its last error fails the test).
func settled(t *testing.T, ctx context.Context, replicated bool, check func() error) {
	t.Helper()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-time.Until(d)/10))
		defer cancel()
	}
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		err := check()
		if err == nil {
			return
		}
		require.True(t, replicated, "%v", err)
		select {
		case <-ctx.Done():
			require.NoError(t, err, "not settled when the test ended")
		case <-time.After(wait):
		}
	}
}

func mustRead(t *testing.T, ctx context.Context, b *jsbackend.Bucket, key string) jsbackend.Entry {
	t.Helper()
	e, err := b.Read(ctx, key)
	require.NoError(t, err)
	return e
}
