package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Entry is one line of the trail: an event at its place in its partition's
// chain. Pos counts the partition's entries from 1; Prev is the digest of
// the entry at Pos-1 (EntryDigest), "" at position 1. The last entry of
// every append carries a Seal: the writer's signature of the entry without
// its seal, which — through the Prev links — vouches for every entry
// before it, the unsigned events among them.
type Entry struct {
	Partition int             `json:"partition"`
	Pos       uint64          `json:"pos"`
	Prev      string          `json:"prev"`
	Event     json.RawMessage `json:"event"`
	Seal      *Seal           `json:"seal,omitempty"`
}

// Seal is a writer's signature of an entry (without its seal).
type Seal struct {
	Signer string `json:"signer"`
	Sig    string `json:"sig"`
}

// head is the end of a partition's chain: its last entry's position and
// digest.
type head struct {
	pos    uint64
	digest string
}

// appendEntry appends the canonical JSON of the entry of event (canonical
// JSON) at h's next position, without a seal, to b, and returns the new
// head.
func appendEntry(b []byte, partition int, h head, event []byte) ([]byte, head) {
	start := len(b)
	pos := h.pos + 1
	b = append(b, `{"event":`...)
	b = append(b, event...)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, `,"pos":`...)
	b = strconv.AppendUint(b, pos, 10)
	b = append(b, `,"prev":`...)
	b = intent.AppendCanonicalString(b, h.digest)
	b = append(b, '}')
	return b, head{pos: pos, digest: digestOf(b[start:])}
}

// sealLast adds s's seal to the entry that ends b (canonical JSON without
// a seal, starting at start): the signature of those bytes.
func (s *Signer) sealLast(b []byte, start int) []byte {
	sig := s.sign(b[start:])
	b = b[:len(b)-1] // the entry's closing brace; "seal" sorts last
	b = append(b, `,"seal":{"sig":`...)
	b = intent.AppendCanonicalString(b, sig)
	b = append(b, `,"signer":`...)
	b = intent.AppendCanonicalString(b, s.id)
	return append(b, '}', '}')
}

// buildBatch returns the lines (newline-separated, canonical JSON) of
// events appended to partition's chain after h, the last one sealed by s,
// and the chain's new head.
func buildBatch(s *Signer, partition int, h head, events [][]byte) ([]byte, head) {
	return appendBatch(nil, s, partition, h, events)
}

// appendBatch is buildBatch appending to b.
func appendBatch(b []byte, s *Signer, partition int, h head, events [][]byte) ([]byte, head) {
	n := len(b) + 140
	for _, e := range events {
		n += len(e) + 160
	}
	b = slices.Grow(b, n-len(b))
	var start int
	for i, e := range events {
		if i > 0 {
			b = append(b, '\n')
		}
		start = len(b)
		b, h = appendEntry(b, partition, h, e)
	}
	return s.sealLast(b, start), h
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// parsedEntry is an entry read from a line, with what checking it needs.
type parsedEntry struct {
	Entry
	digest   string // EntryDigest
	unsealed []byte // canonical JSON without the seal: what the seal signs
}

// parseEntry reads one line of the trail. The error matches ErrInvalid.
func parseEntry(line []byte) (parsedEntry, error) {
	unsealed, _, err := withoutMembers(line, "seal")
	if err != nil {
		return parsedEntry{}, err
	}
	var pe parsedEntry
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pe.Entry); err != nil {
		return parsedEntry{}, fmt.Errorf("%w: entry: %w", ErrInvalid, err)
	}
	switch {
	case pe.Partition < 0:
		return parsedEntry{}, fmt.Errorf("%w: entry: partition %d", ErrInvalid, pe.Partition)
	case pe.Pos == 0:
		return parsedEntry{}, fmt.Errorf("%w: entry: no pos", ErrInvalid)
	case len(pe.Event) == 0 || pe.Event[0] != '{':
		return parsedEntry{}, fmt.Errorf("%w: entry: no event object", ErrInvalid)
	case pe.Seal != nil && (pe.Seal.Signer == "" || pe.Seal.Sig == ""):
		return parsedEntry{}, fmt.Errorf("%w: entry: a seal without signer or sig", ErrInvalid)
	}
	pe.unsealed, pe.digest = unsealed, digestOf(unsealed)
	return pe, nil
}

// EntryDigest is the digest of a trail line, as the next entry's Prev
// names it: hex(sha256(JCS(entry without "seal"))).
func EntryDigest(line []byte) (string, error) {
	pe, err := parseEntry(line)
	if err != nil {
		return "", err
	}
	return pe.digest, nil
}
