package dedup_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// What a held lease keeps on the heap: the live heap after a collection
// with n leases held, less that once they are let go (the server, in this
// process, keeps its own records either way), over n. It prints the
// figure; it asserts none.
func TestLeaseHeldHeap(t *testing.T) {
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := dedup.Open(ctx, jetStream(t, s.ClientURL()), dedup.BucketConfig{Bucket: "LEASEMEM"})
	require.NoError(t, err)
	const n = 5000
	reqs := make([]dedup.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = dedup.ClaimRequest{Key: fmt.Sprintf("t.k%05d", i), Tool: "t", Session: "s", Fingerprint: "fp", Holder: "w1", Lease: time.Hour}
	}
	leases := make([]*dedup.Lease, 0, n)
	for _, req := range reqs {
		res, err := l.Claim(ctx, req)
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		leases = append(leases, res.Lease)
	}
	held := liveHeap()
	runtime.KeepAlive(leases)
	clear(leases)
	released := liveHeap()
	t.Logf("%d leases held: %d bytes of live heap each", n, (int64(held)-int64(released))/n)
	runtime.KeepAlive(reqs)
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
