package audit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The trail's work for one operation on the worker: its three events
// (claimed, fired, the signed outcome, with its result's digest) encoded
// and chained, as in a batch of 200. The JetStream append is not in it.
func BenchmarkOperationEvents(b *testing.B) {
	s, err := GenerateSigner()
	if err != nil {
		b.Fatal(err)
	}
	key := "bench_noop." + strings.Repeat("ab", 32)
	fp := strings.Repeat("cd", 32)
	result := json.RawMessage(`{"echo":{"n":1,"pad":"` + strings.Repeat("x", 240) + `"}}`)
	var events [][]byte
	var h head
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		claimed := Event{Kind: KindClaimed, Key: key, Tool: "bench_noop", Fingerprint: fp, Holder: "bench-1", Attempt: 1, IntentSeq: 12345, ArgsDigest: fp, At: now}
		fired := Event{Kind: KindFired, Key: key, Holder: "bench-1", Attempt: 1, Effect: "noop", At: now}
		receipt := s.Sign(Outcome(key, "bench_noop", "", fp, intent.StatusCompleted, result, nil, 1, 12345, now))
		events = append(events, claimed.Canonical(), fired.Canonical(), receipt)
		if len(events) >= 200 {
			_, h = buildBatch(s, 0, h, events)
			events = events[:0]
		}
	}
}

// The same without the receipt's signature: what the trail costs beside it.
func BenchmarkOperationEventsUnsigned(b *testing.B) {
	s, err := GenerateSigner()
	if err != nil {
		b.Fatal(err)
	}
	key := "bench_noop." + strings.Repeat("ab", 32)
	fp := strings.Repeat("cd", 32)
	result := json.RawMessage(`{"echo":{"n":1,"pad":"` + strings.Repeat("x", 240) + `"}}`)
	var events [][]byte
	var h head
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		claimed := Event{Kind: KindClaimed, Key: key, Tool: "bench_noop", Fingerprint: fp, Holder: "bench-1", Attempt: 1, IntentSeq: 12345, ArgsDigest: fp, At: now}
		fired := Event{Kind: KindFired, Key: key, Holder: "bench-1", Attempt: 1, Effect: "noop", At: now}
		outcome := Outcome(key, "bench_noop", "", fp, intent.StatusCompleted, result, nil, 1, 12345, now)
		events = append(events, claimed.Canonical(), fired.Canonical(), outcome.Canonical())
		if len(events) >= 200 {
			_, h = buildBatch(s, 0, h, events)
			events = events[:0]
		}
	}
}
