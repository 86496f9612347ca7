package dedup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// benchSync is a server's durability setting.
type benchSync struct {
	name string
	set  func(*server.Options)
}

var benchSyncs = []benchSync{
	{"SyncAlways", func(o *server.Options) { o.SyncAlways = true }},
	{"Sync10ms", func(o *server.Options) { o.SyncInterval = 10 * time.Millisecond }},
	{"Lazy", func(*server.Options) {}}, // the server's default: sync every 2 minutes
}

type benchMode struct {
	name string
	opts []dedup.Option
}

var benchModes = []benchMode{
	{"Unbatched", nil},
	{"Batched", []dedup.Option{dedup.WithBatching(dedup.BatchConfig{})}}, // the defaults: 4 in flight
	{"Batched1", []dedup.Option{dedup.WithBatching(dedup.BatchConfig{InFlight: 1})}},
	{"Batched2", []dedup.Option{dedup.WithBatching(dedup.BatchConfig{InFlight: 2})}},
}

// BenchmarkIntents measures the ledger writes of an intent — a claim (create)
// and a completion (compare-and-set) — with n intents in flight on one
// connection to a single file-storage server, for each durability setting,
// one write at a time and group-committed. Use a fixed count, e.g.
//
//	go test -run '^$' -bench Intents -benchtime 10000x ./pkg/dedup/
//
// It reports intents/s and the p50 and p99 latency of an intent.
func BenchmarkIntents(b *testing.B) {
	for _, sy := range benchSyncs {
		b.Run(sy.name, func(b *testing.B) {
			l := benchLedgers(b, sy)
			for _, m := range benchModes {
				for _, n := range []int{64, 256} {
					b.Run(fmt.Sprintf("%s/inflight=%d", m.name, n), func(b *testing.B) {
						r := runIntents(b, l[m.name], b.N, n, 0)
						r.report(b)
					})
				}
			}
		})
	}
}

// BenchmarkHalfPeak measures the latency of an intent at half the peak rate
// with durable writes: it finds the peak with 256 intents in flight, then
// offers half of it at a steady pace.
//
//	go test -run '^$' -bench HalfPeak -benchtime 10000x ./pkg/dedup/
func BenchmarkHalfPeak(b *testing.B) {
	l := benchLedgers(b, benchSyncs[0])
	for _, m := range benchModes {
		b.Run(m.name, func(b *testing.B) {
			peak := runIntents(b, l[m.name], b.N, 256, 0)
			r := runIntents(b, l[m.name], b.N, 1024, peak.rate/2)
			b.ReportMetric(peak.rate, "peak-intents/s")
			r.report(b)
		})
	}
}

// benchLedgers starts a server and returns a ledger of each mode on its own
// connection.
func benchLedgers(b *testing.B, sy benchSync) map[string]*dedup.Ledger {
	s := natstest.RunServer(b, sy.set)
	ls := map[string]*dedup.Ledger{}
	for _, m := range benchModes {
		js := jetStream(b, s.ClientURL())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "BENCH", AtomicPublish: true}, m.opts...)
		cancel()
		require.NoError(b, err)
		b.Cleanup(l.Close)
		ls[m.name] = l
	}
	return ls
}

type loadResult struct {
	rate     float64
	p50, p99 time.Duration
}

func (r loadResult) report(b *testing.B) {
	b.ReportMetric(r.rate, "intents/s")
	b.ReportMetric(float64(r.p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(r.p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op")
}

var benchRun atomic.Int64

// runIntents runs total intents, at most inflight at once, each a claim of a
// fresh key and its completion. With rate > 0 intents start at that pace
// (open loop) instead of as soon as a slot frees.
func runIntents(b *testing.B, l *dedup.Ledger, total, inflight int, rate float64) loadResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := benchRun.Add(1)
	lat := make([]time.Duration, total)
	var failed atomic.Int64
	one := func(i int, started time.Time) {
		res, err := l.Claim(ctx, dedup.ClaimRequest{
			Key:         fmt.Sprintf("bench.%d.%d", run, i),
			Fingerprint: "fp",
			Holder:      "bench",
		})
		if err == nil && res.Outcome == dedup.Acquired {
			_, err = res.Lease.Complete(ctx, json.RawMessage(`{"ok":true}`), 1)
		}
		if err != nil || res.Outcome != dedup.Acquired {
			failed.Add(1)
		}
		lat[i] = time.Since(started)
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	slots := make(chan struct{}, inflight)
	for i := range total {
		due := start
		if rate > 0 {
			due = start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			time.Sleep(time.Until(due))
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if rate == 0 {
				due = time.Now()
			}
			one(i, due)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	require.Zero(b, failed.Load(), "failed intents")
	slices.Sort(lat)
	return loadResult{
		rate: float64(total) / elapsed.Seconds(),
		p50:  lat[total/2],
		p99:  lat[total*99/100],
	}
}
