package audit

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// Whatever a trail file holds, verifying it ends in a report or a break,
// never a panic, and the same report the fast way, with workers or not, as
// the long way; so does verifying an event.
func FuzzVerify(f *testing.F) {
	s, err := GenerateSigner()
	if err != nil {
		f.Fatal(err)
	}
	keys, err := NewKeySet(s.Public("w", time.Time{}))
	if err != nil {
		f.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	events := [][]byte{(&Event{Kind: KindClaimed, Key: "t.k", At: at}).Canonical()}
	for _, e := range s.SignBatch([]Event{{Kind: KindOutcome, Key: "t.k", At: at}, {Kind: KindOutcome, Key: "t.j", At: at}}) {
		events = append(events, e)
	}
	data, h := buildBatch(s, 0, head{digest: GenesisDigest("inst", 0)}, events)
	f.Add(data)
	cp := s.SignCheckpoint(Checkpoint{Installation: "inst", Partition: 0, Partitions: 1, Size: h.pos, First: 1, Head: h.digest, At: at})
	f.Add(append(append(data, '\n'), MarshalCheckpoints([]Checkpoint{cp})...))
	f.Add(events[1])
	f.Add([]byte(`{"partition":0,"pos":1,"prev":"","event":{"kind":"x","at":"2026-01-02T03:04:05Z","sig":"AA","signer":"00","proof":["Lzz"]}}`))
	f.Add([]byte("{}\n[]\nnull\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		for _, opts := range [][]VerifyOption{{Partial()}, nil, {From([]Checkpoint{cp})}} {
			r, err := Verify(open, keys, opts...)
			if err == nil && r == nil {
				t.Fatal("no report and no error")
			}
			verifyWays(t, data, keys, opts...)
		}
		_, _ = ParseCheckpoints(data)
		_, _ = VerifyEvent(data, keys)
		_, _ = ParseKeys(data)
	})
}

// Cutting members out of canonical JSON by slicing it makes what the
// canonicalizer's way makes.
func FuzzQuickWithout(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":1,"seal":{"sig":"x"}}`, `{"proof":["L0"],"sig":"s","z":[1,{"sig":2}]}`, `{"b":"\"sig\":","sig":""}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		quick, _, ok := quickWithout(data, "sig", "seal")
		if !ok {
			return
		}
		slow, _, err := slowWithout(data, "sig", "seal")
		if err != nil || !bytes.Equal(quick, slow) {
			t.Fatalf("%s: quick %s, slow %s (%v)", data, quick, slow, err)
		}
	})
}
