package intent

import (
	"strings"
	"testing"
	"time"
)

// A worker's admission of one intent as pkg/client sends it (args
// canonical, 256 bytes of payload): decoding the envelope and deriving its
// key and fingerprint.
func BenchmarkDecodeDerive(b *testing.B) {
	data := []byte(`{"args":{"n":12345,"pad":"` + strings.Repeat("x", 240) + `","to":"a@example.com"},` +
		`"call_id":"call-1","created_at":"2026-01-02T15:04:05Z","session":"s-1","tool":"send_email"}`)
	spec := KeySpec{}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		d, err := DecodeEnvelope(data, Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := d.Derive(spec, now); err != nil {
			b.Fatal(err)
		}
	}
}
