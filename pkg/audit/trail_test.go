package audit_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	s2block "github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type bundle struct {
	js    jetstream.JetStream
	names intent.Names
	ctx   context.Context
}

func setup(t *testing.T) bundle {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s.ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	names, err := intent.NewNames("AUDT")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	_, err = audit.EnsureStream(ctx, js, names, audit.StreamConfig{})
	require.NoError(t, err)
	return bundle{js: js, names: names, ctx: ctx}
}

func (b bundle) trail(t *testing.T, s *audit.Signer, holder string, partitions, queue int) *audit.Trail {
	t.Helper()
	tr, err := audit.NewTrail(b.js, audit.TrailConfig{Names: b.names, Installation: "test-installation", Partitions: partitions, Signer: s, Holder: holder, Queue: queue, MaxBatch: 7})
	require.NoError(t, err)
	tr.Start()
	return tr
}

// export reads the whole trail.
func (b bundle) export(t *testing.T, f audit.Filter) []byte {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, audit.Read(b.ctx, b.js, b.names, f, func(line []byte) error {
		out.Write(line)
		out.WriteByte('\n')
		return nil
	}))
	return out.Bytes()
}

func verify(t *testing.T, data []byte, keys *audit.KeySet) *audit.Report {
	t.Helper()
	r, err := audit.Verify(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, keys, audit.Partial())
	require.NoError(t, err)
	return r
}

// Two workers append to the same partitions at once: each chain stays
// whole (no position twice, none missing) and holds every event.
func TestTrailConcurrentWriters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s1, err := audit.GenerateSigner()
	require.NoError(t, err)
	s2, err := audit.GenerateSigner()
	require.NoError(t, err)
	for _, s := range []*audit.Signer{s1, s2} {
		require.NoError(t, audit.PublishKey(b.ctx, b.js, b.names, s.Public("w", time.Now().Add(-time.Hour))))
	}
	t1, t2 := b.trail(t, s1, "w1", 2, 0), b.trail(t, s2, "w2", 2, 0)
	const n = 300
	var wg sync.WaitGroup
	for i, tr := range []*audit.Trail{t1, t2} {
		wg.Go(func() {
			for j := range n {
				key := fmt.Sprintf("k%d-%d", i, j)
				ev := audit.Event{Kind: audit.KindClaimed, Key: key, Holder: fmt.Sprint("w", i), Attempt: 1, At: time.Now()}
				if j%5 == 0 {
					tr.AppendSigned(intent.Partition(key, 2), s1.Sign(ev))
				} else {
					tr.Append(intent.Partition(key, 2), ev)
				}
			}
		})
	}
	wg.Wait()
	t1.Close(b.ctx)
	t2.Close(b.ctx)
	require.Equal(t, uint64(n), t1.Stats().Appended)
	require.Equal(t, uint64(n), t2.Stats().Appended)
	require.Zero(t, t1.Stats().Dropped+t2.Stats().Dropped)

	keys, err := audit.PublishedKeys(b.ctx, b.js, b.names)
	require.NoError(t, err)
	require.Equal(t, 2, keys.Len())
	r := verify(t, b.export(t, audit.Filter{Partition: audit.AllPartitions}), keys)
	require.Nil(t, r.Break)
	require.Equal(t, 2*n, r.Entries)
	require.Len(t, r.Partitions, 2)
	for _, p := range r.Partitions {
		require.Equal(t, uint64(1), p.First)
		require.Equal(t, uint64(p.Entries), p.Last)
	}

	// Appends are stored compressed: every one is marked and decodes, and
	// together they are smaller than their lines (an append of one short
	// line alone may not be).
	st, err := b.js.Stream(b.ctx, b.names.AuditStream)
	require.NoError(t, err)
	info, err := st.Info(b.ctx)
	require.NoError(t, err)
	stored, decoded := 0, 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(b.ctx, seq)
		require.NoError(t, err)
		require.Equal(t, audit.EncodingS2, m.Header.Get(audit.HeaderEncoding))
		lines, err := s2block.Decode(nil, m.Data)
		require.NoError(t, err)
		require.Contains(t, string(lines), `,"pos":`)
		stored, decoded = stored+len(m.Data), decoded+len(lines)
	}
	require.Less(t, stored, decoded)

	// One partition, and one key's history.
	r1 := verify(t, b.export(t, audit.Filter{Partition: 1}), keys)
	require.Nil(t, r1.Break)
	require.Equal(t, r.Partitions[1].Entries, r1.Entries)
	h, err := audit.History(b.ctx, b.js, b.names, 2, "k1-7", time.Time{})
	require.NoError(t, err)
	require.Len(t, h, 1)
	require.Contains(t, string(h[0]), `"key":"k1-7"`)
}

// While the stream cannot be reached, events queue up to the limit and
// the rest are dropped and counted; once it is back the chain goes on,
// its next append starting with a gap event that says how many.
func TestTrailOutageLeavesAGap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := audit.GenerateSigner()
	require.NoError(t, err)
	tr := b.trail(t, s, "w1", 1, 5)
	defer tr.Close(b.ctx)
	ev := func(i int) audit.Event {
		return audit.Event{Kind: audit.KindClaimed, Key: fmt.Sprint("k", i), Attempt: 1, At: time.Now()}
	}
	tr.Append(0, ev(0))
	waitFor(t, func() bool { return tr.Stats().Appended == 1 })

	// The stream no longer takes the trail's subjects: appends find no
	// stream, as with its server gone.
	stream, err := b.js.Stream(b.ctx, b.names.AuditStream)
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	parked := cfg
	parked.Subjects = []string{"parked.audit.*"}
	_, err = b.js.UpdateStream(b.ctx, parked)
	require.NoError(t, err)
	for i := 1; i <= 20; i++ {
		tr.Append(0, ev(i))
	}
	waitFor(t, func() bool { return tr.Stats().Dropped >= 15 })
	require.LessOrEqual(t, tr.Stats().Queued, int64(5))

	_, err = b.js.UpdateStream(b.ctx, cfg)
	require.NoError(t, err)
	waitFor(t, func() bool { st := tr.Stats(); return st.Queued == 0 && st.Appended+st.Dropped == 21 })
	tr.Append(0, ev(21))
	waitFor(t, func() bool { st := tr.Stats(); return st.Queued == 0 && st.Appended+st.Dropped == 22 })

	keys, err := audit.NewKeySet(s.Public("w1", time.Time{}))
	require.NoError(t, err)
	r := verify(t, b.export(t, audit.Filter{Partition: audit.AllPartitions}), keys)
	require.Nil(t, r.Break)
	require.Len(t, r.Gaps, 1)
	st := tr.Stats()
	require.Equal(t, st.Dropped, r.Gaps[0].Dropped)
	require.Equal(t, int(st.Appended)+1, r.Entries, "every event written, and the gap")
}

// waitFor polls cond until it holds or the test's deadline is near.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	for !cond() {
		if time.Now().After(deadline.Add(-5 * time.Second)) {
			t.Fatal("condition not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An installation's id is made once and kept; a trail's chains start at
// its genesis; a worker's checkpoints hold each chain's first position,
// size and head, and the latest stored is the longest; the keys bucket's
// other entries are not keys.
func TestCheckpointsOfATrail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := audit.GenerateSigner()
	require.NoError(t, err)
	require.NoError(t, audit.PublishKey(b.ctx, b.js, b.names, s.Public("w", time.Now().Add(-time.Hour))))
	// The trail reads (here: makes) the installation's id itself.
	tr, err := audit.NewTrail(b.js, audit.TrailConfig{Names: b.names, Partitions: 2, Signer: s, Holder: "w", MaxBatch: 4})
	require.NoError(t, err)
	tr.Start()
	for i := range 10 {
		tr.Append(0, audit.Event{Kind: audit.KindClaimed, Key: fmt.Sprint("k", i), Holder: "w", At: time.Now()})
	}
	tr.Close(b.ctx)
	id, err := audit.Installation(b.ctx, b.js, b.names)
	require.NoError(t, err)
	again, err := audit.Installation(b.ctx, b.js, b.names)
	require.NoError(t, err)
	require.Equal(t, id, again, "made once")

	cps, err := audit.MakeCheckpoints(b.ctx, b.js, b.names, id, 2, s)
	require.NoError(t, err)
	require.Len(t, cps, 2)
	require.Equal(t, uint64(10), cps[0].Size)
	require.Equal(t, uint64(1), cps[0].First)
	require.Zero(t, cps[1].Size, "partition 1 holds nothing")
	require.Empty(t, cps[1].Head)
	keys, err := audit.PublishedKeys(b.ctx, b.js, b.names)
	require.NoError(t, err)
	for _, c := range cps {
		require.NoError(t, c.Verify(keys))
	}
	data := append(b.export(t, audit.Filter{Partition: audit.AllPartitions}), audit.MarshalCheckpoints(cps)...)
	r, err := audit.Verify(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, keys)
	require.NoError(t, err)
	require.Nil(t, r.Break)
	require.Equal(t, id, r.Installation)
	require.False(t, r.Partitions[0].Unbound, "the chain starts at its genesis")

	// Stored: a shorter one does not replace a longer one.
	require.NoError(t, audit.StoreCheckpoints(b.ctx, b.js, b.names, cps))
	older := cps[0]
	older.Size, older.Head = 4, "0000000000000000000000000000000000000000000000000000000000000000"
	require.NoError(t, audit.StoreCheckpoints(b.ctx, b.js, b.names, []audit.Checkpoint{s.SignCheckpoint(older)}))
	stored, err := audit.LatestCheckpoints(b.ctx, b.js, b.names)
	require.NoError(t, err)
	require.Equal(t, string(audit.MarshalCheckpoints(cps)), string(audit.MarshalCheckpoints(stored)))
	// The id and the checkpoints are in the keys bucket, but not keys.
	require.Equal(t, 1, keys.Len())
}

// At low rates a partition's next append waits its linger for more
// events; a full batch goes at once, and Close writes what waits.
func TestTrailLingersAtLowRates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := audit.GenerateSigner()
	require.NoError(t, err)
	tr, err := audit.NewTrail(b.js, audit.TrailConfig{Names: b.names, Installation: "test-installation", Partitions: 1, Signer: s,
		Holder: "w", MaxBatch: 5, Linger: time.Hour})
	require.NoError(t, err)
	tr.Start()
	ev := func(i int) audit.Event {
		return audit.Event{Kind: audit.KindClaimed, Key: fmt.Sprint("k", i), Holder: "w", At: time.Now()}
	}
	tr.Append(0, ev(1)) // no append before it: written at once
	waitFor(t, func() bool { return tr.Stats().Appended == 1 })
	for i := 2; i <= 4; i++ {
		tr.Append(0, ev(i))
	}
	require.Never(t, func() bool { return tr.Stats().Appends > 1 }, 300*time.Millisecond, 10*time.Millisecond, "the next append lingers")
	tr.Append(0, ev(5))
	tr.Append(0, ev(6)) // five queued: a full batch
	waitFor(t, func() bool { return tr.Stats().Appended == 6 })
	require.EqualValues(t, 2, tr.Stats().Appends)
	tr.Append(0, ev(7))
	tr.Close(b.ctx)
	st := tr.Stats()
	require.EqualValues(t, 7, st.Appended, "Close writes what lingers")
	require.EqualValues(t, 3, st.Appends)
	require.Zero(t, st.Dropped)
}
