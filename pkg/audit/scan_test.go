package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// scanFixture is a signer, its keys, lines as the writers make them (a
// fired event, receipts signed together with their proofs, a gap, the last
// one sealed) and a checkpoint at their second position.
type scanFixture struct {
	keys  *KeySet
	lines [][]byte
	cp    Checkpoint
}

func newScanFixture(tb testing.TB) scanFixture {
	tb.Helper()
	s, err := GenerateSigner()
	if err != nil {
		tb.Fatal(err)
	}
	keys, err := NewKeySet(s.Public("w", time.Time{}))
	if err != nil {
		tb.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	events := [][]byte{(&Event{Kind: KindFired, Key: "t.k", Tool: "t", Holder: "w", Attempt: 1, IntentSeq: 7, Effect: "noop", At: at}).Canonical()}
	var outcomes []Event
	for i := range 3 {
		outcomes = append(outcomes, Outcome(fmt.Sprint("t.k", i), "t", "", "fp", intent.StatusCompleted, json.RawMessage(`{"n":1}`), nil, 1, uint64(i), at))
	}
	for _, r := range s.SignBatch(outcomes) {
		events = append(events, r)
	}
	events = append(events, (&Event{Kind: KindGap, Holder: "w2", Dropped: 3, From: at, To: at.Add(time.Second), At: at}).Canonical())
	data, _ := buildBatch(s, 0, head{digest: GenesisDigest("inst", 0)}, events)
	lines := bytes.Split(data, []byte{'\n'})
	d, err := EntryDigest(lines[1])
	if err != nil {
		tb.Fatal(err)
	}
	cp := s.SignCheckpoint(Checkpoint{Installation: "inst", Partition: 0, Partitions: 1, Size: 2, First: 1, Head: d, At: at})
	return scanFixture{keys: keys, lines: lines, cp: cp}
}

// describe is all a prepared line says, errors by their text.
func describe(r *lineResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "n=%d skip=%v part=%d pos=%d prev=%q digest=%s before=%v gap=%v signer=%q holder=%q dropped=%d from=%s to=%s sealed=%v sealSigner=%q",
		r.n, r.skip, r.partition, r.pos, r.prev, r.digest, r.verifiedBefore, r.gap, r.signer, r.holder, r.dropped,
		r.gapFrom.Format(time.RFC3339Nano), r.gapTo.Format(time.RFC3339Nano), r.sealed, r.sealSigner)
	if r.malformed != nil {
		fmt.Fprintf(&b, " malformed=%v", r.malformed)
	}
	if r.evErr != nil {
		fmt.Fprintf(&b, " evErr=%s:%v", breakKind(r.evErr), r.evErr)
	}
	if r.sealErr != nil {
		fmt.Fprintf(&b, " sealErr=%s:%v", breakKind(r.sealErr), r.sealErr)
	}
	return b.String()
}

// agree checks that line prepares the same by the fast path and the long
// way, with and without a checkpoint given to From, and that the fast
// reading of its position is json.Unmarshal's; it reports whether the fast
// path read the entry itself.
func (fx scanFixture) agree(t *testing.T, line []byte) (quick bool) {
	t.Helper()
	for _, from := range []map[int]Checkpoint{nil, {0: fx.cp}} {
		fast := &lineWorker{keys: fx.keys, sigs: &sigCache{}, from: from}
		slow := &lineWorker{keys: fx.keys, sigs: &sigCache{}, from: from, slow: true}
		var rf, rs lineResult
		fast.prepare(3, line, &rf)
		slow.prepare(3, line, &rs)
		if df, ds := describe(&rf), describe(&rs); df != ds {
			t.Fatalf("%q (from %v):\nfast %s\nslow %s", line, from != nil, df, ds)
		}
		var s lineScan
		if s.scan(line) {
			if e, ok := s.quickEntry(line); ok && from == nil {
				var r lineResult
				quick = fast.quick(line, &e, &r)
			}
			if p, pos, ok := s.quickLoc(line); ok {
				var loc struct {
					Partition int    `json:"partition"`
					Pos       uint64 `json:"pos"`
				}
				if err := json.Unmarshal(line, &loc); err != nil || loc.Partition != p || loc.Pos != pos {
					t.Fatalf("%q: quick position %d/%d, json.Unmarshal %d/%d (%v)", line, p, pos, loc.Partition, loc.Pos, err)
				}
			}
		}
	}
	return quick
}

// The fast path reads every line the writers make, and reads it as the
// long way does.
func TestQuickLineReadsWritersLines(t *testing.T) {
	fx := newScanFixture(t)
	for i, line := range fx.lines {
		if !fx.agree(t, line) {
			t.Errorf("line %d: the fast path is not sure of a writer's line: %s", i+1, line)
		}
	}
}

// Lines the fast path must leave to the long way, or read as it does:
// members another case of a field's name, of another type, escaped,
// repeated, out of order, seals of other members, and more.
func TestQuickLineAgreesOnOddLines(t *testing.T) {
	fx := newScanFixture(t)
	sealed := string(fx.lines[len(fx.lines)-1])
	receipt := string(fx.lines[1])
	edits := [][2]string{
		{`"partition":0`, `"Partition":0`}, {`"partition":0`, `"partition":-1`}, {`"partition":0`, `"partition":"0"`},
		{`"partition":0`, `"partition":0.0`}, {`"partition":0`, `"partition":null`}, {`"pos":`, `"POS":`}, {`"pos":`, `"pos":0,"pos_":`},
		{`"prev":"`, `"prev":"\u0041`}, {`"prev":"`, `"prev":"\\`}, {`"prev":"`, `"prev":1,"x":"`}, {`"seal":{`, `"seal":{"a":1,`},
		{`"seal":{"sig":"`, `"seal":{"sig":"\u0041`}, {`"signer":"`, `"signer":"","x":"`}, {`"seal":{`, `"seal":null,"z":{`},
		{`"kind":"`, `"Kind":"`}, {`"kind":"`, `"kind":"","x":"`}, {`"kind":"fired"`, `"kind":"fired\n"`}, {`"kind":"fired"`, `"kind":"fired\u001f"`},
		{`"at":"`, `"at":"x`}, {`"at":"`, `"AT":"`}, {`"attempt":1`, `"attempt":"1"`}, {`"attempt":1`, `"attempt":1.5`},
		{`"attempt":1`, `"attempt":-1`}, {`"intent_seq":`, `"intent_seq":-`}, {`"attempt":1`, `"attempt":1234567890123456`},
		{`"holder":"w"`, `"holder":["w"]`}, {`"effect":"noop"`, `"effect":null`}, {`"dropped":3`, `"dropped":-3`},
		{`"from":"`, `"from":"2026`}, {`{"event":{`, `{"event":{"args":[1,{"a":null}],`}, {`{"event":{`, `{"event":{"Args":7,`},
		{`{"event":{`, `{"event":{"zz":{"Kind":"x"},`}, {`{"event":{`, `{"event":{"ééé":1,`}, {`"event":{`, `"event":[],"x":{`},
		{`"proof":["`, `"proof":["X`}, {`"proof":["L`, `"proof":["l`}, {`"proof":[`, `"proof":[1,`}, {`"proof":[`, `"proof":null,"q":[`},
		{`"proof":["`, `"proof":[],"q":["`}, {`"sig":"`, `"sig":"A`}, {`"sig":"`, `"sig":1,"sih":"`}, {`"signer":"`, `"signer":"x`},
		{`"signer":"`, `"signer":"","t":"`}, {`"status":"completed"`, `"status":7`}, {`"v":1`, `"v":true`},
		{`}`, ` }`}, {`{`, `{"a":1,`}, {`"v":1}`, `"v":1}}`}, {`"event"`, `"eveNt"`},
	}
	// A proof step of uppercase hex: the same sibling, but not its one
	// text.
	i := strings.Index(receipt, `"proof":["`) + len(`"proof":["L`)
	i += strings.IndexAny(receipt[i:], "abcdef")
	fx.agree(t, []byte(receipt[:i]+strings.ToUpper(receipt[i:i+1])+receipt[i+1:]))
	for _, base := range []string{sealed, receipt, string(fx.lines[0]), string(fx.lines[4])} {
		fx.agree(t, []byte(base))
		for _, e := range edits {
			if strings.Contains(base, e[0]) {
				fx.agree(t, []byte(strings.Replace(base, e[0], e[1], 1)))
			}
		}
	}
	// Names another case of a field's sort before the lowercase ones, so
	// these lines are canonical.
	for _, line := range []string{``, `{}`, `null`, `[]`, `{"partition":1,"pos":1}`, `{"pos":2}`, `{"partition":0,"pos":1,"x":{"y":[`,
		`{"Pos":1,"event":{"at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"prev":""}`,
		`{"Partition":1,"event":{"at":"2026-01-02T03:04:05Z","kind":"k"},"pos":1,"prev":""}`,
		`{"event":{"Dropped":"x","at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"pos":1,"prev":""}`,
		`{"event":{"Holder":"h","at":"2026-01-02T03:04:05Z","kind":"gap"},"partition":0,"pos":1,"prev":""}`,
		`{"event":{"Kind":"x","at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"pos":1,"prev":""}`,
		`{"event":{"at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"pos":0,"prev":""}`,
		`{"event":{"at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"pos":1,"prev":"","seal":{"sig":"","signer":"w"}}`,
		`{"event":{"at":"2026-01-02T03:04:05Z","dropped":-1,"kind":"k"},"partition":0,"pos":1,"prev":""}`,
		`{"event":{"at":"2026-01-02T03:04:05Z","kind":"k","proof":[],"sig":"x","signer":"w"},"partition":0,"pos":1,"prev":""}`,
		`{"event":{"at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"pos":1,"prev":""}`,
		`{"event":{"at":"2026-01-02T03:04:05Z","kind":"k","sig":"x"},"partition":0,"pos":1,"prev":""}`} {
		fx.agree(t, []byte(line))
	}
}

// Whatever a line holds, the fast path reads it as the long way does, or
// leaves it to it.
func FuzzQuickLine(f *testing.F) {
	fx := newScanFixture(f)
	for _, line := range fx.lines {
		f.Add(line)
	}
	f.Add([]byte(`{"event":{"Kind":"x","at":"2026-01-02T03:04:05Z","kind":"k"},"partition":0,"pos":1,"prev":""}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		fx.agree(t, line)
	})
}

// A node the memo holds is the node hashed.
func TestNodeMemo(t *testing.T) {
	var m nodeMemo
	var a, b, c [32]byte
	a[0], b[0], c[31] = 1, 2, 3
	for range 2 {
		for _, pair := range [][2][32]byte{{a, b}, {b, a}, {a, c}, {c, b}, {a, a}} {
			if got, want := m.node(pair[0], pair[1]), nodeHash(pair[0], pair[1]); got != want {
				t.Fatalf("node(%x, %x) = %x, want %x", pair[0][:2], pair[1][:2], got[:4], want[:4])
			}
		}
	}
	for i := range nodeMemoSize + 10 { // past its bound
		var x [32]byte
		x[0], x[1] = byte(i), byte(i>>8)
		if m.node(x, a) != nodeHash(x, a) {
			t.Fatal(i)
		}
	}
}
