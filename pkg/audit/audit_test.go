package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

var at0 = time.Date(2026, 3, 4, 5, 6, 7, 890123000, time.UTC)

func newSigner(t *testing.T) *Signer {
	t.Helper()
	s, err := GenerateSigner()
	require.NoError(t, err)
	return s
}

func keysOf(t *testing.T, signers ...*Signer) *KeySet {
	t.Helper()
	var pks []PublicKey
	for _, s := range signers {
		pks = append(pks, s.Public("w", time.Time{}))
	}
	ks, err := NewKeySet(pks...)
	require.NoError(t, err)
	return ks
}

// The event's own encoder writes RFC 8785: exactly what the generic
// canonicalizer makes of it, for strings that need escaping and members
// set or not.
func TestEventCanonicalIsRFC8785(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	strs := []string{"", "plain", `q " \ b`, "\x00\x01\b\f\n\r\t\x1f\x7f", "<&>", "é☃𝄞\U0010ffff", "\u2028", "bad \xff utf8", "\ufeff"}
	pick := func() string { return strs[rng.IntN(len(strs))] }
	for i := range 3000 {
		e := Event{Kind: Kind(pick() + "k"), Key: pick(), Tool: pick(), Session: pick(), Fingerprint: pick(), Holder: pick(),
			Attempt: rng.IntN(4), Attempts: rng.IntN(4), IntentSeq: uint64(rng.IntN(3)) << 40, Status: intent.Status(pick()),
			ResultDigest: pick(), ErrorCode: pick(), ErrorDigest: pick(), RecordFingerprint: pick(), PreviousHolder: pick(),
			PreviousAttempt: rng.IntN(3), Reason: pick(), Op: pick(), By: pick(), Effect: pick(), Destination: pick(),
			ForwardedKey: pick(), ArgsDigest: pick(), Dropped: uint64(rng.IntN(3)), At: at0.Add(time.Duration(rng.IntN(1e9)))}
		if rng.IntN(2) == 0 {
			e.Args = json.RawMessage(`{"b":[1, 2.50, "x"], "a": {"z":null,"é":true}}`)
			e.From, e.To = at0, at0.Add(time.Second)
		}
		if rng.IntN(2) == 0 {
			e.Sig, e.Signer = pick(), pick()
		}
		var packed []byte
		for range rng.IntN(3) {
			var sib [32]byte
			for j := range sib {
				sib[j] = byte(rng.IntN(256))
			}
			packed = append(append(packed, "LR"[rng.IntN(2)]), sib[:]...)
		}
		e.Proof = unpack(packed)
		got := e.Canonical()
		want, err := intent.Canonicalize(got)
		require.NoErrorf(t, err, "event %d: %s", i, got)
		require.Equalf(t, string(want), string(got), "event %d", i)
		// Signing inserts "sig" and "proof" into the encoding without
		// them: the same bytes.
		bare := e
		bare.Sig, bare.Proof = "", nil
		unsigned, m := bare.appendCanonicalMarked(nil, false)
		signed := appendWithSignature(nil, unsigned, m, packed, e.Sig)
		require.Equalf(t, string(got), string(signed), "event %d", i)
		if e.Sig == "" || string(intent.AppendCanonicalString(nil, e.Sig)) == `"`+e.Sig+`"` {
			require.Equalf(t, len(signed), signedSize(len(unsigned), len(packed)/stepSize, e.Sig), "event %d: its size", i)
		}
		var back Event
		require.NoError(t, json.Unmarshal(got, &back))
		require.Equal(t, e.Key == "", back.Key == "")
	}
}

func TestSignVerifyEvent(t *testing.T) {
	t.Parallel()
	s, other := newSigner(t), newSigner(t)
	keys := keysOf(t, s)
	ev := Outcome("send_email.abc", "send_email", "run-7", "fp1", intent.StatusCompleted, json.RawMessage(`{"id": 42}`), nil, 1, 9, at0)
	signed := s.Sign(ev)

	got, err := VerifyEvent(signed, keys)
	require.NoError(t, err)
	require.Equal(t, s.ID(), got.Signer)
	require.Equal(t, "send_email.abc", got.Key)
	d, _ := ResultDigest(json.RawMessage(`{"id":42}`))
	require.Equal(t, d, got.ResultDigest)

	// Whitespace and member order do not matter: the canonical form does.
	var m map[string]any
	require.NoError(t, json.Unmarshal(signed, &m))
	pretty, _ := json.MarshalIndent(m, "", "  ")
	_, err = VerifyEvent(pretty, keys)
	require.NoError(t, err)

	// Any change of a signed member breaks it.
	for _, edit := range []struct{ from, to string }{
		{`"status":"completed"`, `"status":"failed"`},
		{`"attempts":1`, `"attempts":2`},
		{`"key":"send_email.abc"`, `"key":"send_email.abd"`},
		{`"intent_seq":9`, `"intent_seq":9,"extra":1`},
	} {
		bad := []byte(strings.Replace(string(signed), edit.from, edit.to, 1))
		require.NotEqual(t, string(signed), string(bad), edit.from)
		_, err := VerifyEvent(bad, keys)
		require.ErrorIs(t, err, ErrBadSignature, edit.from)
	}
	// Another key's signature, an unknown signer, a repeated member.
	_, err = VerifyEvent(other.Sign(ev), keys)
	require.ErrorIs(t, err, ErrUnknownSigner)
	_, err = VerifyEvent([]byte(strings.Replace(string(signed), `"key":`, `"key":"x","key":`, 1)), keys)
	require.ErrorIs(t, err, ErrInvalid)
	// Unsigned.
	_, err = VerifyEvent(ev.Canonical(), keys)
	require.ErrorIs(t, err, ErrBadSignature)
}

func TestKeyValidity(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	pk := s.Public("w1", at0)
	pk.NotAfter = at0.Add(time.Hour)
	keys, err := NewKeySet(pk)
	require.NoError(t, err)
	for _, c := range []struct {
		at time.Time
		ok bool
	}{{at0, true}, {at0.Add(-time.Nanosecond), false}, {at0.Add(time.Hour - 1), true}, {at0.Add(time.Hour), false}} {
		_, err := VerifyEvent(s.Sign(Event{Kind: KindConflict, Key: "k", At: c.at}), keys)
		if c.ok {
			require.NoError(t, err, c.at)
		} else {
			require.ErrorIs(t, err, ErrKeyNotValid, c.at)
		}
	}
	// A keys file: round trip, and its checks.
	data, err := json.Marshal(keys)
	require.NoError(t, err)
	back, err := ParseKeys(data)
	require.NoError(t, err)
	require.Equal(t, keys.Keys(), back.Keys())
	_, err = ParseKeys([]byte(strings.Replace(string(data), pk.ID, "0000000000000000", 1)))
	require.ErrorIs(t, err, ErrInvalid)
	_, err = ParseKeys([]byte(`{"keys":[],"extra":1}`))
	require.ErrorIs(t, err, ErrInvalid)
}

func TestLoadOrCreateSigner(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sub", "audit.key")
	s, created, err := LoadOrCreateSigner(path)
	require.NoError(t, err)
	require.True(t, created)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	again, created, err := LoadOrCreateSigner(path)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, s.ID(), again.ID())

	require.NoError(t, os.WriteFile(path, []byte("not a key"), 0o600))
	_, _, err = LoadOrCreateSigner(path)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestVerifyReceipt(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	key := "charge." + strings.Repeat("ab", 32)
	result := json.RawMessage(`{"charge":"ch_1","amount":500}`)
	res := intent.Result{Key: key, Tool: "charge", Status: intent.StatusCompleted, Fingerprint: "fp", Attempts: 1, IntentSeq: 3, Result: result,
		CompletedAt: at0}
	res.Receipt = s.Sign(Outcome(key, "charge", "", "fp", intent.StatusCompleted, result, nil, 1, 3, at0))
	_, err := VerifyReceipt(res, keys)
	require.NoError(t, err)

	// A result repeating a member name is refused, never left unbound.
	dup := res
	dup.Result = json.RawMessage(`{"charge":"ch_1","charge":"ch_2","amount":500}`)
	_, err = VerifyReceipt(dup, keys)
	require.ErrorIs(t, err, ErrInvalid)

	// A replay re-encoded by another front door: same canonical result.
	re := res
	re.Result = json.RawMessage(`{ "amount": 500, "charge": "ch_1" }`)
	_, err = VerifyReceipt(re, keys)
	require.NoError(t, err)

	// By its compact ledger key, for an operator's decision by that key.
	compact, err := intent.LedgerKey(key, intent.LayoutCompact)
	require.NoError(t, err)
	byCompact := res
	byCompact.Receipt = s.Sign(Outcome(compact, "charge", "", "fp", intent.StatusCompleted, result, nil, 1, 3, at0))
	_, err = VerifyReceipt(byCompact, keys)
	require.NoError(t, err)

	// Another operation's receipt, another result, another status.
	other := res
	other.Key = "charge." + strings.Repeat("cd", 32)
	_, err = VerifyReceipt(other, keys)
	require.ErrorIs(t, err, ErrReceiptMismatch)
	changed := res
	changed.Result = json.RawMessage(`{"charge":"ch_1","amount":5000}`)
	_, err = VerifyReceipt(changed, keys)
	require.ErrorIs(t, err, ErrReceiptMismatch)
	failed := res
	failed.Status, failed.Result, failed.Error = intent.StatusFailed, nil, &intent.Error{Code: "effect_failed", Message: "no"}
	_, err = VerifyReceipt(failed, keys)
	require.ErrorIs(t, err, ErrReceiptMismatch)
	none := res
	none.Receipt = nil
	_, err = VerifyReceipt(none, keys)
	require.ErrorIs(t, err, ErrNoReceipt)

	// A failure's receipt binds its error.
	e := intent.Error{Code: "effect_failed", Message: "card declined"}
	failed.Error, failed.Receipt = &e, s.Sign(Outcome(key, "charge", "", "fp", intent.StatusFailed, nil, &e, 1, 3, at0))
	_, err = VerifyReceipt(failed, keys)
	require.NoError(t, err)
	failed.Error = &intent.Error{Code: "effect_failed", Message: "card accepted"}
	_, err = VerifyReceipt(failed, keys)
	require.ErrorIs(t, err, ErrReceiptMismatch)

	// A result with no canonical form is not bound, and says so by having
	// no digest.
	big := json.RawMessage(`{"id":12345678901234567890}`)
	bigRes := res
	bigRes.Result = big
	bigRes.Receipt = s.Sign(Outcome(key, "charge", "", "fp", intent.StatusCompleted, big, nil, 1, 3, at0))
	ev, err := VerifyReceipt(bigRes, keys)
	require.NoError(t, err)
	require.Empty(t, ev.ResultDigest)
}

// testInstallation is the installation of the trails the tests build.
const testInstallation = "inst-a"

// trail builds a trail of n events per partition over parts partitions,
// appended in batches of up to 3, and returns its lines.
func trail(t *testing.T, s *Signer, parts, n int) [][]byte {
	t.Helper()
	return trailOf(t, s, testInstallation, parts, n)
}

// trailOf is trail of another installation.
func trailOf(t *testing.T, s *Signer, installation string, parts, n int) [][]byte {
	t.Helper()
	var lines [][]byte
	heads := make([]head, parts)
	for p := range parts {
		heads[p].digest = GenesisDigest(installation, p)
		for i := 0; i < n; {
			var events [][]byte
			for j := 0; j < 3 && i < n; j, i = j+1, i+1 {
				ev := Event{Kind: KindClaimed, Key: "k" + string(rune('a'+p)), Holder: "w", Attempt: i + 1, At: at0.Add(time.Duration(i) * time.Second)}
				if i%4 == 3 {
					events = append(events, s.Sign(Outcome(ev.Key, "t", "", "fp", intent.StatusCompleted, json.RawMessage(`1`), nil, 1, 1, ev.At)))
				} else {
					events = append(events, ev.Canonical())
				}
			}
			var data []byte
			data, heads[p] = buildBatch(s, p, heads[p], events)
			lines = append(lines, bytes.Split(data, []byte{'\n'})...)
		}
	}
	return lines
}

func verifyLines(t *testing.T, keys *KeySet, lines [][]byte) *Report {
	t.Helper()
	data := append(bytes.Join(lines, []byte{'\n'}), '\n')
	r, err := Verify(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, keys, Partial())
	require.NoError(t, err)
	return r
}

func TestVerifyChain(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	lines := trail(t, s, 2, 10)

	r := verifyLines(t, keys, lines)
	require.Nil(t, r.Break)
	require.Equal(t, 20, r.Entries)
	require.Len(t, r.Partitions, 2)
	require.Equal(t, PartitionReport{Partition: 0, First: 1, Last: 10, Entries: 10, Head: r.Partitions[0].Head}, r.Partitions[0])
	digest, err := EntryDigest(lines[9])
	require.NoError(t, err)
	require.Equal(t, digest, r.Partitions[0].Head)
	require.Equal(t, []string{s.ID()}, r.Signers)

	// Partitions interleaved: still whole.
	mixed := make([][]byte, 0, len(lines))
	for i := range 10 {
		mixed = append(mixed, lines[i], lines[10+i])
	}
	require.Nil(t, verifyLines(t, keys, mixed).Break)

	// A later part of the chain alone (older entries expired) verifies,
	// from where it starts.
	r = verifyLines(t, keys, lines[3:10])
	require.Nil(t, r.Break)
	require.Equal(t, uint64(4), r.Partitions[0].First)

	breakOf := func(ls [][]byte) *Break {
		t.Helper()
		b := verifyLines(t, keys, ls).Break
		require.NotNil(t, b)
		return b
	}
	clone := func() [][]byte {
		out := make([][]byte, len(lines))
		for i := range lines {
			out[i] = bytes.Clone(lines[i])
		}
		return out
	}

	// One byte of an unsigned event in the middle of an append: the next
	// entry names another digest.
	edited := clone()
	edited[4] = bytes.Replace(edited[4], []byte(`"attempt":5`), []byte(`"attempt":6`), 1)
	b := breakOf(edited)
	require.Equal(t, BreakEdited, b.Kind)
	require.Equal(t, Break{Line: 5, Partition: 0, Pos: 5, Kind: BreakEdited}, Break{Line: b.Line, Partition: b.Partition, Pos: b.Pos, Kind: b.Kind})

	// One byte of a signed event: its own signature.
	edited = clone()
	edited[3] = bytes.Replace(edited[3], []byte(`"status":"completed"`), []byte(`"status":"completes"`), 1)
	b = breakOf(edited)
	require.Equal(t, BreakBadSignature, b.Kind)
	require.Equal(t, uint64(4), b.Pos)
	require.Contains(t, b.Detail, "event")

	// One byte of a sealed entry (the last of an append): its seal.
	edited = clone()
	edited[2] = bytes.Replace(edited[2], []byte(`"holder":"w"`), []byte(`"holder":"x"`), 1)
	b = breakOf(edited)
	require.Equal(t, BreakBadSignature, b.Kind)
	require.Equal(t, uint64(3), b.Pos)
	require.Contains(t, b.Detail, "seal")

	// One entry dropped.
	dropped := append(clone()[:4:4], lines[5:]...)
	b = breakOf(dropped)
	require.Equal(t, BreakDropped, b.Kind)
	require.Equal(t, uint64(6), b.Pos)
	require.Contains(t, b.Detail, "position 5 is missing")

	// Two entries swapped.
	swapped := clone()
	swapped[4], swapped[5] = swapped[5], swapped[4]
	b = breakOf(swapped)
	require.Equal(t, BreakReordered, b.Kind)
	require.Equal(t, 5, b.Line)

	// The last append of a partition cut in half: nothing seals the rest.
	cut := append(clone()[:8:8], lines[10:]...)
	b = breakOf(cut)
	require.Equal(t, BreakUnsealed, b.Kind)
	require.Equal(t, uint64(8), b.Pos)

	// An entry whose seal was signed by a key not given.
	b = breakOf(trail(t, newSigner(t), 1, 3))
	require.Equal(t, BreakUnknownSigner, b.Kind)

	// Not JSON.
	junk := clone()
	junk[6] = []byte(`{"partition":0,`)
	b = breakOf(junk)
	require.Equal(t, BreakMalformed, b.Kind)
	require.Equal(t, 7, b.Line)
}

func TestVerifyReportsGaps(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	gap := Event{Kind: KindGap, Holder: "w2", Dropped: 17, From: at0, To: at0.Add(time.Minute), At: at0.Add(2 * time.Minute)}
	data, _ := buildBatch(s, 3, head{}, [][]byte{gap.Canonical(), (&Event{Kind: KindClaimed, Key: "k", At: at0}).Canonical()})
	r := verifyLines(t, keysOf(t, s), bytes.Split(data, []byte{'\n'}))
	require.Nil(t, r.Break)
	require.Equal(t, []Gap{{Partition: 3, Pos: 1, Holder: "w2", Dropped: 17, From: at0, To: at0.Add(time.Minute)}}, r.Gaps)
}

// An event of a kind, and with members, this version does not know
// verifies like any other: the format is open.
func TestVerifyUnknownKinds(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	future := []byte(`{"at":"2026-03-04T05:06:07Z","budget":{"left":3},"key":"k","kind":"budget_refused","v":1}`)
	signed := s.Sign(Event{Kind: "probe_answer", Key: "k", At: at0})
	data, _ := buildBatch(s, 0, head{}, [][]byte{future, signed})
	r := verifyLines(t, keysOf(t, s), bytes.Split(data, []byte{'\n'}))
	require.Nil(t, r.Break)
	require.Equal(t, 2, r.Entries)
}

func TestErrorsAreDistinct(t *testing.T) {
	t.Parallel()
	all := []error{ErrInvalid, ErrBadSignature, ErrUnknownSigner, ErrKeyNotValid, ErrNoReceipt, ErrReceiptMismatch}
	for i, a := range all {
		for j, b := range all {
			require.Equal(t, i == j, errors.Is(a, b))
		}
	}
}

// Events signed together each verify alone, with one signature; a proof
// moved to another event of the batch, or changed, does not.
func TestSignBatch(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	for n := 1; n <= 9; n++ {
		events := make([]Event, n)
		for i := range events {
			events[i] = Outcome(fmt.Sprintf("t.k%d", i), "t", "", "fp", intent.StatusCompleted, json.RawMessage(`{"i":1}`), nil, 1, uint64(i+1), at0)
		}
		signed := s.SignBatch(events)
		var sigs []string
		for i, raw := range signed {
			ev, err := VerifyEvent(raw, keys)
			require.NoError(t, err, "n=%d i=%d", n, i)
			require.Equal(t, fmt.Sprintf("t.k%d", i), ev.Key)
			require.Equal(t, string(ev.Canonical()), string(raw))
			sigs = append(sigs, ev.Sig)
			if n == 1 {
				require.NotContains(t, string(raw), `"proof"`)
			}
		}
		for _, sig := range sigs {
			require.Equal(t, sigs[0], sig, "one signature per batch")
		}
		if n < 2 {
			continue
		}
		var a, b map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(signed[0], &a))
		require.NoError(t, json.Unmarshal(signed[1], &b))
		a["proof"] = b["proof"]
		moved, _ := json.Marshal(a)
		_, err := VerifyEvent(moved, keys)
		require.ErrorIs(t, err, ErrBadSignature, "n=%d: another event's proof", n)
		flipped := strings.Replace(string(signed[0]), `"R`, `"L`, 1)
		flipped = strings.Replace(flipped, `"proof":["L`, `"proof":["R`, 1)
		if flipped != string(signed[0]) {
			_, err = VerifyEvent([]byte(flipped), keys)
			require.Error(t, err, "n=%d: a step's side changed", n)
		}
	}
}

// Callers signing at once share signatures, and each gets its own event
// back, verified.
func TestBatchSignerConcurrent(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	bs := NewBatchSigner(s)
	const n = 200
	out := make([]json.RawMessage, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out[i] = bs.Sign(Event{Kind: KindOutcome, Key: fmt.Sprintf("t.k%d", i), Status: intent.StatusCompleted, At: at0})
		})
	}
	wg.Wait()
	for i, raw := range out {
		ev, err := VerifyEvent(raw, keys)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("t.k%d", i), ev.Key)
	}
	events, sigs := bs.Stats()
	require.Equal(t, uint64(n), events)
	require.Less(t, sigs, events, "callers at once share signatures")
}

// A result is unbound only for its numbers beyond ±2^53 (or a float64):
// any other fault refuses it, wherever the big numbers are.
func TestBoundDigest(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		result string
		err    error
	}{
		{`{"a":[1e400,-12345678901234567890,"x\"1e400"],"b":1}`, nil},
		{`12345678901234567890`, nil},
		{`{"a":1,"a":2}`, ErrInvalid},
		{`{"n":12345678901234567890,"a":1,"a":2}`, ErrInvalid},
		{`{"n":1e400,"s":"\ud800"}`, ErrInvalid},
		{`{"n":1e400,`, ErrInvalid},
		{`[1.2.3]`, ErrInvalid},
	} {
		d, err := boundDigest([]byte(c.result))
		require.ErrorIs(t, err, c.err, c.result)
		require.Empty(t, d, c.result)
	}
	d, err := boundDigest([]byte(`{"b":1, "a":2}`))
	require.NoError(t, err)
	require.Equal(t, Digest([]byte(`{"a":2,"b":1}`)), d)
}
