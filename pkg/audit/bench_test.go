package audit

import (
	"encoding/json"
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
