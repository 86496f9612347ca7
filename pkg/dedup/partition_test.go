package dedup_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// partKey is the i-th derived-shape key of tool.
func partKey(tool string, i int) string {
	return fmt.Sprintf("%s.%x", tool, sha256.Sum256([]byte(strconv.Itoa(i))))
}

// The partition count is recorded at creation and read at open: another
// count is refused with both named, 0 adopts the recorded one, a plain
// bucket is one partition, and re-ensuring a partition keeps the record.
func TestPartitionsRecorded(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	kvs, _, err := dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "PARTS", Partitions: 4})
	require.NoError(t, err)
	require.Len(t, kvs, 4)
	for i, kv := range kvs {
		require.Equal(t, dedup.PartitionBucket("PARTS", i), kv.Bucket())
	}
	n, err := dedup.RecordedPartitions(ctx, js, "PARTS")
	require.NoError(t, err)
	require.Equal(t, 4, n)

	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "PARTS", Partitions: 8})
	require.ErrorIs(t, err, dedup.ErrPartitions)
	require.ErrorContains(t, err, "has 4 partitions")
	require.ErrorContains(t, err, "started with 8")
	kvs, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "PARTS"})
	require.NoError(t, err)
	require.Len(t, kvs, 4, "0 adopts the recorded count")

	// A plain re-ensure of partition 0 (an older writer) keeps the record.
	_, err = dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "PARTS"})
	require.NoError(t, err)
	n, err = dedup.RecordedPartitions(ctx, js, "PARTS")
	require.NoError(t, err)
	require.Equal(t, 4, n)

	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "PARTS"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, 4, l.Partitions())
	require.Equal(t, []string{"PARTS", "PARTS_P1", "PARTS_P2", "PARTS_P3"}, l.Buckets())

	// A bucket made before partitioning is a one-partition ledger.
	_, err = dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "PLAIN"})
	require.NoError(t, err)
	l, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "PLAIN"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, 1, l.Partitions())
	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "PLAIN", Partitions: 2})
	require.ErrorIs(t, err, dedup.ErrPartitions)

	_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "MISSING"}, dedup.Bind())
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound)
	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "BAD", Partitions: 3})
	require.ErrorIs(t, err, dedup.ErrInvalid)
}

// Every key's record is in its partition's bucket (intent.Partition) and in
// no other, and the ledger reads it back; paging a listing across the
// partitions finds every live record once.
func TestPartitionedRoutingAndList(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "ROUTE", Partitions: 4})
	require.NoError(t, err)
	defer l.Close()
	kvs, layout, err := dedup.BindPartitions(ctx, js, "ROUTE")
	require.NoError(t, err)
	require.Equal(t, intent.LayoutCompact, layout, "a new ledger's")

	var keys, listed []string
	perPart := make([]int, 4)
	for i := range 40 {
		key := partKey("send_email", i)
		keys = append(keys, key)
		sk, err := intent.LedgerKey(key, layout)
		require.NoError(t, err)
		listed = append(listed, sk) // a listing shows the stored keys
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "send_email", Fingerprint: "fp", Holder: "w1"})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		_, err = res.Lease.Complete(ctx, json.RawMessage(`{"ok":true}`), 1)
		require.NoError(t, err)
		p := intent.Partition(key, 4)
		perPart[p]++
		stored, err := intent.LedgerKey(key, layout)
		require.NoError(t, err)
		for j, kv := range kvs {
			_, err := kv.Get(ctx, stored)
			if j == p {
				require.NoError(t, err, "key %s in its partition %d", key, p)
			} else {
				require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "key %s not in partition %d", key, j)
			}
		}
		rec, _, err := l.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, rec.Status)
	}
	for p, n := range perPart {
		require.Positive(t, n, "partition %d holds some of the keys", p)
	}

	var got []string
	q := dedup.Query{Limit: 7}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 20, "paging ends")
		page, err := l.List(ctx, q)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Records), 7)
		for _, r := range page.Records {
			got = append(got, r.Key)
		}
		if !page.More {
			break
		}
		require.Greater(t, page.Next, q.After, "the cursor moves on")
		q.After = page.Next
	}
	require.ElementsMatch(t, listed, got, "every live record once")

	// A scan bound stops a page early; paging on still finds every record.
	got = got[:0]
	q = dedup.Query{MaxScan: 5, Statuses: []intent.Status{intent.StatusCompleted}}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 40, "paging ends")
		page, err := l.List(ctx, q)
		require.NoError(t, err)
		for _, r := range page.Records {
			got = append(got, r.Key)
		}
		if !page.More {
			break
		}
		q.After = page.Next
	}
	require.ElementsMatch(t, listed, got)

	_, err = l.List(ctx, dedup.Query{After: 9 << 56})
	require.ErrorIs(t, err, dedup.ErrInvalid, "a cursor naming a partition the ledger lacks")

	// Forget reaches the key's partition.
	_, err = l.Forget(ctx, keys[3])
	require.NoError(t, err)
	tomb, _, err := l.Get(ctx, keys[3])
	require.NoError(t, err)
	require.Equal(t, intent.StatusForgotten, tomb.Status)
}

// On a 3-node cluster, SpreadLeaders moves the leaders of 8 partitions,
// gathered on one node, until no node leads more than its share (3).
func TestSpreadLeaders(t *testing.T) {
	t.Parallel()
	servers := natstest.RunCluster(t, 3)
	js := jetStream(t, servers[0].ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "SPREAD", Partitions: 8, Replicas: 3})
	require.NoError(t, err)
	defer l.Close()

	// Gather every leader on one node first, so that the spreading has
	// work to do whatever the cluster chose.
	first := servers[0].Name()
	gather := func() bool {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		leaders, err := l.Leaders(ctx)
		if err != nil {
			return false
		}
		all := true
		for i, ld := range leaders {
			if ld != first {
				all = false
				if err := dedup.StepDown(ctx, l, i, first); err != nil {
					t.Logf("step down %d (%s) to %s: %v", i, ld, first, err)
				}
			}
		}
		return all
	}
	require.Eventually(t, gather, time.Minute, 200*time.Millisecond, "every leader on %s", first)

	spread := func() bool {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		moved, err := l.SpreadLeaders(ctx)
		if err != nil {
			t.Logf("spread: %v", err)
			return false
		}
		leaders, err := l.Leaders(ctx)
		t.Logf("moved %d, leaders %v %v", moved, leaders, err)
		if err != nil {
			return false
		}
		load := map[string]int{}
		for _, ld := range leaders {
			if ld == "" {
				return false
			}
			load[ld]++
		}
		for _, s := range servers {
			if load[s.Name()] < 2 || load[s.Name()] > 3 {
				return false
			}
		}
		return true
	}
	require.Eventually(t, spread, time.Minute, 500*time.Millisecond, "8 leaders over 3 nodes: 2 or 3 on each")

	// The ledger works on every partition after the moves.
	for i := range 12 {
		key := partKey("refund", i)
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "w1"})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
	}
}
