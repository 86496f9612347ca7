package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The trail's work for one operation on the worker, as in the unique
// benchmark row: its fired event (recording the claim too) and its
// receipt, signed in a batch of 16, their result's digest, both chained
// and compressed in an append of 200 events. The JetStream append is not
// in it.
func BenchmarkOperationEvents(b *testing.B) {
	s, err := GenerateSigner()
	if err != nil {
		b.Fatal(err)
	}
	key := "bench_noop." + strings.Repeat("ab", 32)
	fp := strings.Repeat("cd", 32)
	result := json.RawMessage(`{"echo":{"n":1,"pad":"` + strings.Repeat("x", 240) + `"}}`)
	var events [][]byte
	var outcomes []Event
	var h head
	var lines, packed []byte
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		fired := Event{Kind: KindFired, Key: key, Tool: "bench_noop", Fingerprint: fp, Holder: "bench-1", Attempt: 1, IntentSeq: 12345,
			ArgsDigest: fp, Effect: "noop", At: now}
		events = append(events, fired.Canonical())
		outcomes = append(outcomes, Outcome(key, "bench_noop", "", fp, intent.StatusCompleted, result, nil, 1, 12345, now))
		if len(outcomes) == 16 {
			for _, r := range s.SignBatch(outcomes) {
				events = append(events, r)
			}
			outcomes = outcomes[:0]
		}
		if len(events) >= 200 {
			lines, h = appendBatch(lines[:0], s, 0, h, events)
			packed = s2.Encode(packed[:cap(packed)], lines)
			events = events[:0]
		}
	}
}

// benchTrail is the trail of ops operations over 4 partitions as a worker
// writes it (each a fired event and a receipt, receipts signed 16 at once,
// appends of up to 200 events), its checkpoints, and the checkpoints at
// the operation before the last tail.
func benchTrail(b testing.TB, s *Signer, ops, tail int) (trail []byte, cps, before []Checkpoint) {
	key := "bench_noop." + strings.Repeat("ab", 32)
	fp := strings.Repeat("cd", 32)
	result := json.RawMessage(`{"echo":{"n":1}}`)
	heads := make([]head, 4)
	events := make([][][]byte, 4)
	cps, before = make([]Checkpoint, 4), make([]Checkpoint, 4)
	for p := range heads {
		heads[p].digest = GenesisDigest("bench", p)
	}
	checkpoint := func(p int) Checkpoint {
		first := uint64(0)
		if heads[p].pos > 0 {
			first = 1
		}
		return s.SignCheckpoint(Checkpoint{Installation: "bench", Partition: p, Partitions: 4, Size: heads[p].pos, First: first, Head: heads[p].digest, At: time.Now()})
	}
	flush := func(p int) {
		if len(events[p]) > 0 {
			var lines []byte
			lines, heads[p] = appendBatch(nil, s, p, heads[p], events[p])
			trail = append(append(trail, lines...), '\n')
			events[p] = events[p][:0]
		}
	}
	var outcomes []Event
	for i := range ops {
		p := i % 4
		if i == ops-tail {
			for q := range 4 {
				flush(q)
				before[q] = checkpoint(q)
			}
		}
		now := time.Now()
		events[p] = append(events[p], (&Event{Kind: KindFired, Key: key, Tool: "bench_noop", Fingerprint: fp, Holder: "bench-1", Attempt: 1,
			IntentSeq: uint64(i), Effect: "noop", At: now}).Canonical())
		outcomes = append(outcomes, Outcome(key, "bench_noop", "", fp, intent.StatusCompleted, result, nil, 1, uint64(i), now))
		if len(outcomes) == 16 {
			for j, r := range s.SignBatch(outcomes) {
				q := (i - 15 + j) % 4
				events[q] = append(events[q], r)
			}
			outcomes = outcomes[:0]
		}
		if len(events[p]) >= 200 {
			flush(p)
		}
	}
	for q := range 4 {
		flush(q)
		cps[q] = checkpoint(q)
	}
	return append(trail, MarshalCheckpoints(cps)...), cps, before
}

// Verifying a day of operations whole, and only what follows a checkpoint
// verified before (the last 1 000 of 20 000 operations), on one goroutine
// and on GOMAXPROCS. ns/operation is per operation of the trail (for from:
// 19 000 skipped, 1 000 verified); from's ns/verified-operation is its
// whole time per operation verified.
func BenchmarkVerify(b *testing.B) {
	s, err := GenerateSigner()
	if err != nil {
		b.Fatal(err)
	}
	keys, err := NewKeySet(s.Public("bench", time.Time{}))
	if err != nil {
		b.Fatal(err)
	}
	const ops, tail = 20000, 1000
	trail, _, before := benchTrail(b, s, ops, tail)
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(trail)), nil }
	for _, c := range []struct {
		name string
		opts []VerifyOption
	}{{"whole", nil}, {"from", []VerifyOption{From(before)}}} {
		for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
			b.Run(fmt.Sprintf("%s/workers=%d", c.name, workers), func(b *testing.B) {
				for b.Loop() {
					r, err := Verify(open, keys, append(c.opts, withWorkers(workers))...)
					if err != nil || r.Break != nil {
						b.Fatal(err, r.Break)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/ops, "ns/operation")
				if c.name == "from" {
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/tail, "ns/verified-operation")
				}
			})
		}
	}
}
