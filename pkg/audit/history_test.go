package audit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// opKey is the operation of historyTrail: its full key, and its compact
// one (which its firing names).
var opKey = "refund." + strings.Repeat("0f", 32)

// historyTrail is one partition's chain: the operation opKey claimed,
// fired and completed among another's events, with a gap, in three
// appends.
func historyTrail(t *testing.T, s *Signer) [][]byte {
	t.Helper()
	compact, err := intent.LedgerKey(opKey, intent.LayoutCompact)
	require.NoError(t, err)
	other := func(i int) []byte {
		return (&Event{Kind: KindClaimed, Key: "other", Holder: "w", Attempt: i, At: at0}).Canonical()
	}
	appends := [][][]byte{
		{other(1), (&Event{Kind: KindClaimed, Key: opKey, Holder: "w1", Attempt: 1, At: at0}).Canonical(), other(2)},
		{(&Event{Kind: KindFired, Key: compact, Holder: "w1", Attempt: 1, Effect: "webhook", At: at0.Add(time.Second)}).Canonical(),
			(&Event{Kind: KindGap, Holder: "w2", Dropped: 3, From: at0, To: at0.Add(time.Second), At: at0.Add(2 * time.Second)}).Canonical()},
		{s.Sign(Outcome(opKey, "t", "", "fp", intent.StatusCompleted, json.RawMessage(`1`), nil, 1, 1, at0.Add(3*time.Second))), other(3)},
	}
	var lines [][]byte
	var h head
	for _, events := range appends {
		var data []byte
		data, h = buildBatch(s, 0, h, events)
		lines = append(lines, bytes.Split(data, []byte{'\n'})...)
	}
	return lines
}

type verdict struct {
	Kind      Kind
	Pos       uint64
	Signature Check
	Link      Check
}

func checkHistory(keys *KeySet, lines [][]byte) ([]verdict, []Checked) {
	return checkHistoryOf(opKey, keys, lines)
}

func checkHistoryOf(key string, keys *KeySet, lines [][]byte) ([]verdict, []Checked) {
	h := NewHistoryChecker(key, keys)
	for _, l := range lines {
		h.Add(l)
	}
	out := h.Entries()
	vs := make([]verdict, len(out))
	for i, c := range out {
		vs[i] = verdict{c.Event.Kind, c.Pos, c.Signature, c.Link}
	}
	return vs, out
}

func TestHistoryChecker(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	lines := historyTrail(t, s)
	V, F, U := CheckVerified, CheckFailed, CheckUnknown

	got, out := checkHistory(keys, lines)
	require.Equal(t, []verdict{{KindClaimed, 2, V, V}, {KindFired, 4, V, V}, {KindGap, 5, V, V}, {KindOutcome, 6, V, V}}, got)
	require.Equal(t, s.ID(), out[0].Signer)
	require.Equal(t, "w1", out[1].Event.Holder)

	// By its compact key, the same history; another operation's, none.
	compact, err := intent.LedgerKey(opKey, intent.LayoutCompact)
	require.NoError(t, err)
	byCompact, _ := checkHistoryOf(compact, keys, lines)
	require.Equal(t, got, byCompact)
	none, _ := checkHistoryOf("refund."+strings.Repeat("aa", 32), keys, lines)
	require.Equal(t, []verdict{{KindGap, 5, V, V}}, none, "a gap is every operation's")

	// Read from a later append: the first entry read has nothing to link to.
	got, out = checkHistory(keys, lines[3:])
	require.Equal(t, []verdict{{KindFired, 4, V, U}, {KindGap, 5, V, V}, {KindOutcome, 6, V, V}}, got)
	require.Contains(t, out[0].LinkDetail, "starts here")

	clone := func() [][]byte {
		c := make([][]byte, len(lines))
		for i := range lines {
			c[i] = bytes.Clone(lines[i])
		}
		return c
	}

	// An unsigned event edited inside its append: the next entry's link
	// breaks, so no seal vouches for it.
	edited := clone()
	edited[1] = bytes.Replace(edited[1], []byte(`"holder":"w1"`), []byte(`"holder":"w9"`), 1)
	got, out = checkHistory(keys, edited)
	require.Equal(t, []verdict{{KindClaimed, 2, F, V}, {KindFired, 4, V, V}, {KindGap, 5, V, V}, {KindOutcome, 6, V, V}}, got)
	require.Contains(t, out[0].SignatureDetail, "chain breaks after it")

	// The sealed last entry of an append edited: its seal fails, and the
	// next entry's link.
	edited = clone()
	edited[4] = bytes.Replace(edited[4], []byte(`"dropped":3`), []byte(`"dropped":1`), 1)
	got, out = checkHistory(keys, edited)
	require.Equal(t, []verdict{{KindClaimed, 2, V, V}, {KindFired, 4, F, V}, {KindGap, 5, F, V}, {KindOutcome, 6, V, F}}, got)
	require.Contains(t, out[1].SignatureDetail, "seal")

	// A signed event edited: its own signature.
	edited = clone()
	edited[5] = bytes.Replace(edited[5], []byte(`"status":"completed"`), []byte(`"status":"failed"`), 1)
	got, _ = checkHistory(keys, edited)
	require.Equal(t, verdict{KindOutcome, 6, F, V}, got[3])

	// An entry dropped before one of the operation's (the seal of the
	// append before: nothing vouches for that append's events any more).
	dropped := append(clone()[:2:2], lines[3:]...)
	got, out = checkHistory(keys, dropped)
	require.Equal(t, []verdict{{KindClaimed, 2, F, V}, {KindFired, 4, V, F}, {KindGap, 5, V, V}, {KindOutcome, 6, V, V}}, got)
	require.Contains(t, out[1].LinkDetail, "positions 3 to 3 are missing")

	// Another key's seal: unknown signer.
	got, out = checkHistory(keysOf(t, newSigner(t)), lines)
	require.Equal(t, F, got[0].Signature)
	require.Contains(t, out[0].SignatureDetail, ErrUnknownSigner.Error())

	// The trail read ends inside an append.
	got, _ = checkHistory(keys, lines[:4])
	require.Equal(t, verdict{KindFired, 4, F, V}, got[1])

	// A line of the operation that is not an entry.
	junk := clone()
	junk[3] = []byte(`{"event":{"key":"` + opKey + `",`)
	got, _ = checkHistory(keys, junk)
	require.Equal(t, []verdict{{KindClaimed, 2, V, V}, {"", 0, F, F}, {KindGap, 5, V, F}, {KindOutcome, 6, V, V}}, got)
}

// A chain bound to its installation starts with that installation's
// genesis: its first entry's link verifies for that installation, fails
// for another, and is unknown when the id was not read.
func TestHistoryCheckerGenesis(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	ev := (&Event{Kind: KindClaimed, Key: opKey, Holder: "w1", Attempt: 1, At: at0}).Canonical()
	data, _ := buildBatch(s, 0, head{digest: GenesisDigest("inst-a", 0)}, [][]byte{ev})
	lines := bytes.Split(data, []byte{'\n'})

	check := func(installation string) Checked {
		h := NewHistoryChecker(opKey, keys).WithInstallation(installation)
		for _, l := range lines {
			h.Add(l)
		}
		out := h.Entries()
		require.Len(t, out, 1)
		return out[0]
	}
	require.Equal(t, CheckVerified, check("inst-a").Link)
	other := check("inst-b")
	require.Equal(t, CheckFailed, other.Link)
	require.Contains(t, other.LinkDetail, "neither this installation's genesis")
	unread := check("")
	require.Equal(t, CheckUnknown, unread.Link)
	require.Contains(t, unread.LinkDetail, "was not read")
}
