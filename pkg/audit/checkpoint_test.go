package audit

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// checkpointsOf signs the checkpoints of a trail's lines (each partition's
// last line its head) as a worker of installation would.
func checkpointsOf(t *testing.T, s *Signer, installation string, parts int, lines [][]byte) []Checkpoint {
	t.Helper()
	cps := make([]Checkpoint, parts)
	for p := range parts {
		cps[p] = Checkpoint{Installation: installation, Partition: p, Partitions: parts, At: time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)}
	}
	for _, l := range lines {
		pe, err := parseEntry(l)
		require.NoError(t, err)
		if cps[pe.Partition].First == 0 {
			cps[pe.Partition].First = pe.Pos
		}
		cps[pe.Partition].Size, cps[pe.Partition].Head = pe.Pos, pe.digest
	}
	for p := range cps {
		cps[p] = s.SignCheckpoint(cps[p])
	}
	return cps
}

// withCheckpoints is lines ending with the checkpoint line of cps.
func withCheckpoints(lines [][]byte, cps []Checkpoint) [][]byte {
	return append(cloneLines(lines), MarshalCheckpoints(cps))
}

func cloneLines(ls [][]byte) [][]byte {
	out := make([][]byte, len(ls))
	for i := range ls {
		out[i] = bytes.Clone(ls[i])
	}
	return out
}

// without is lines without those of partition p from position from on.
func without(lines [][]byte, p int, from uint64) [][]byte {
	var out [][]byte
	for _, l := range lines {
		pe, err := parseEntry(l)
		if err == nil && pe.Partition == p && pe.Pos >= from {
			continue
		}
		out = append(out, l)
	}
	return out
}

func requireBreak(t *testing.T, r *Report, kind BreakKind, partition int, pos uint64) {
	t.Helper()
	require.NotNil(t, r.Break, "the trail verified")
	require.Equal(t, kind, r.Break.Kind, r.Break.Error())
	require.Equal(t, partition, r.Break.Partition, r.Break.Error())
	require.Equal(t, pos, r.Break.Pos, r.Break.Error())
}

func verifyWith(t *testing.T, keys *KeySet, lines [][]byte, opts ...VerifyOption) *Report {
	t.Helper()
	data := append(bytes.Join(lines, []byte{'\n'}), '\n')
	r, err := Verify(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, keys, opts...)
	require.NoError(t, err)
	return r
}

// A trail ending with its checkpoints verifies; one that stops short of
// them, lacks a partition, holds another installation's partition, goes
// on past them, or holds none fails, naming the partition and position.
func TestVerifyEdges(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	lines := trail(t, s, 4, 10) // partition p's lines are lines[10p:10p+10], appended 3, 3, 3, 1
	cps := checkpointsOf(t, s, testInstallation, 4, lines)

	r := verifyWith(t, keys, withCheckpoints(lines, cps))
	require.Nil(t, r.Break)
	require.Equal(t, testInstallation, r.Installation)
	require.Len(t, r.Checkpoints, 4)

	// The last append of partition 2 dropped: short of its checkpoint.
	requireBreak(t, verifyWith(t, keys, withCheckpoints(without(lines, 2, 10), cps)), BreakShort, 2, 9)
	// Its first entry dropped: the chain starts at 2, but the checkpoint
	// says the stream held it from 1.
	first := cloneLines(lines)
	first = append(first[:20:20], first[21:]...)
	requireBreak(t, verifyWith(t, keys, withCheckpoints(first, cps)), BreakDropped, 2, 1)
	// Partition 1 removed.
	requireBreak(t, verifyWith(t, keys, withCheckpoints(without(lines, 1, 1), cps)), BreakMissingPartition, 1, 10)
	// ... and its checkpoint with it.
	requireBreak(t, verifyWith(t, keys, withCheckpoints(without(lines, 1, 1), []Checkpoint{cps[0], cps[2], cps[3]})), BreakMissingPartition, 1, 0)
	// Partition 3 replaced by another installation's, signed by the same
	// key: its first link is not this installation's.
	other := trailOf(t, s, "inst-b", 4, 10)
	replaced := append(without(lines, 3, 1), other[30:]...)
	requireBreak(t, verifyWith(t, keys, withCheckpoints(replaced, cps)), BreakInstallation, 3, 1)
	// ... with its checkpoint too: two installations.
	otherCps := checkpointsOf(t, s, "inst-b", 4, other)
	r = verifyWith(t, keys, withCheckpoints(replaced, []Checkpoint{cps[0], cps[1], cps[2], otherCps[3]}))
	require.NotNil(t, r.Break)
	require.Contains(t, r.Break.Detail, "two installations")
	// Entries past the checkpoint it ends with.
	requireBreak(t, verifyWith(t, keys, withCheckpoints(lines, checkpointsOf(t, s, testInstallation, 4, without(lines, 0, 10)))), BreakCheckpoint, 0, 10)
	// No checkpoint: refused, unless partial.
	requireBreak(t, verifyWith(t, keys, lines), BreakNoCheckpoint, -1, 0)
	require.Nil(t, verifyWith(t, keys, lines, Partial()).Break)
	// Cut in half (its checkpoint line with it), checked against a
	// checkpoint kept apart.
	half := lines[:len(lines)/2]
	requireBreak(t, verifyWith(t, keys, half, WithCheckpoints(cps)), BreakMissingPartition, 2, 10)
	requireBreak(t, verifyWith(t, keys, lines[:16], WithCheckpoints(cps)), BreakShort, 1, 6)
	// A checkpoint whose signature does not hold.
	forged := append([]Checkpoint(nil), cps...)
	forged[2].Size--
	r = verifyWith(t, keys, withCheckpoints(lines, forged))
	require.NotNil(t, r.Break)
	require.Equal(t, BreakBadSignature, r.Break.Kind, r.Break.Error())
}

// From a checkpoint verified before, only what follows is verified, and it
// must extend the checkpoint: a rewritten past is refused.
func TestVerifyFrom(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	lines := trail(t, s, 2, 12) // appends of 3: seals at 3, 6, 9, 12
	before := checkpointsOf(t, s, testInstallation, 2, append(cloneLines(lines[:6]), lines[12:18]...))
	cps := checkpointsOf(t, s, testInstallation, 2, lines)

	r := verifyWith(t, keys, withCheckpoints(lines, cps), From(before))
	require.Nil(t, r.Break)
	require.Equal(t, 12, r.Entries, "positions 7 to 12 of each partition")
	require.Equal(t, 6, r.Partitions[0].Skipped)
	// What an export --from holds: only what follows.
	r = verifyWith(t, keys, withCheckpoints(append(cloneLines(lines[6:12]), lines[18:]...), cps), From(before))
	require.Nil(t, r.Break)
	require.Equal(t, 12, r.Entries)

	// The entry at the checkpoint rewritten (and the chain after it
	// rebuilt on it, signed by the same key).
	rewritten := cloneLines(lines)
	ev := Event{Kind: KindClaimed, Key: "kz", Holder: "w", Attempt: 1, At: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
	h := head{pos: 4, digest: mustDigest(t, rewritten[3])}
	var batch []byte
	batch, h = buildBatch(s, 0, h, [][]byte{ev.Canonical(), ev.Canonical()})
	copy(rewritten[4:6], bytes.Split(batch, []byte{'\n'}))
	for i := 6; i < 12; i += 3 {
		batch, h = buildBatch(s, 0, h, [][]byte{ev.Canonical(), ev.Canonical(), ev.Canonical()})
		copy(rewritten[i:i+3], bytes.Split(batch, []byte{'\n'}))
	}
	// Verified whole, the rewritten trail holds with its new checkpoint.
	rcps := checkpointsOf(t, s, testInstallation, 2, rewritten)
	require.Nil(t, verifyWith(t, keys, withCheckpoints(rewritten, rcps)).Break)
	// From the checkpoint verified before, it does not.
	requireBreak(t, verifyWith(t, keys, withCheckpoints(rewritten, rcps), From(before)), BreakCheckpoint, 0, 6)
	requireBreak(t, verifyWith(t, keys, withCheckpoints(rewritten[6:], rcps), From(before)), BreakCheckpoint, 0, 7)
}

func mustDigest(t *testing.T, line []byte) string {
	t.Helper()
	d, err := EntryDigest(line)
	require.NoError(t, err)
	return d
}

// Only the canonical bytes of an entry verify, and only a canonical
// base64url signature.
func TestVerifyCanonicalBytesOnly(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	lines := trail(t, s, 1, 6)
	require.Nil(t, verifyWith(t, keys, lines, Partial()).Break)

	spaced := cloneLines(lines)
	spaced[2] = bytes.Replace(spaced[2], []byte(`,"partition"`), []byte(`, "partition"`), 1)
	requireBreak(t, verifyWith(t, keys, spaced, Partial()), BreakMalformed, 0, 3)
	trailing := cloneLines(lines)
	trailing[2] = append(trailing[2], ' ')
	requireBreak(t, verifyWith(t, keys, trailing, Partial()), BreakMalformed, 0, 3)

	// The seal's signature: 64 bytes are 86 characters, the last holding 4
	// unused bits; setting one changes no byte decoded.
	bits := cloneLines(lines)
	var e Entry
	require.NoError(t, json.Unmarshal(bits[2], &e))
	sig := e.Seal.Sig
	last := strings.IndexByte(b64Alphabet, sig[len(sig)-1])
	require.Zero(t, last&0xF)
	changed := sig[:len(sig)-1] + string(b64Alphabet[last|1])
	raw1, err := b64.DecodeString(sig)
	require.NoError(t, err)
	raw2, err := b64.DecodeString(changed)
	require.NoError(t, err, "the lax decoding takes it")
	require.Equal(t, raw1, raw2)
	bits[2] = bytes.Replace(bits[2], []byte(sig), []byte(changed), 1)
	requireBreak(t, verifyWith(t, keys, bits, Partial()), BreakBadSignature, 0, 3)
}

const b64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// A chain written before chains were bound to their installation (its
// first link "") verifies, and is told apart.
func TestVerifyUnboundChain(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	keys := keysOf(t, s)
	ev := Event{Kind: KindClaimed, Key: "k", Holder: "w", At: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
	data, _ := buildBatch(s, 0, head{}, [][]byte{ev.Canonical(), ev.Canonical()})
	lines := bytes.Split(data, []byte{'\n'})
	r := verifyWith(t, keys, withCheckpoints(lines, checkpointsOf(t, s, testInstallation, 1, lines)))
	require.Nil(t, r.Break)
	require.True(t, r.Partitions[0].Unbound)
	// A bound one is not.
	data, _ = buildBatch(s, 0, head{digest: GenesisDigest(testInstallation, 0)}, [][]byte{ev.Canonical(), ev.Canonical()})
	lines = bytes.Split(data, []byte{'\n'})
	r = verifyWith(t, keys, withCheckpoints(lines, checkpointsOf(t, s, testInstallation, 1, lines)))
	require.Nil(t, r.Break)
	require.False(t, r.Partitions[0].Unbound)
}
