package audit

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Check is what verifying one property of a history entry came to.
type Check string

// Values of a Check.
const (
	// CheckVerified: it holds.
	CheckVerified Check = "verified"
	// CheckFailed: it does not hold; the entry's detail says why.
	CheckFailed Check = "failed"
	// CheckUnknown: what was read cannot tell (the first entry read has no
	// predecessor to be linked to).
	CheckUnknown Check = "unknown"
)

// Checked is one entry of an operation's history and what verifying it in
// its partition's chain came to, as Verify checks a whole trail.
type Checked struct {
	Line      []byte // the entry as the trail holds it
	Partition int
	Pos       uint64
	Event     Event
	// Signature is whether the event's bytes are vouched for: a signed
	// event by its own signature, an unsigned one by the seal of its
	// append, reached through unbroken links. Signer is the key that
	// vouches.
	Signature       Check
	SignatureDetail string
	Signer          string
	// Link is whether the entry is at its place: the entry before it was
	// read and its prev names that entry's digest.
	Link       Check
	LinkDetail string
}

// HistoryChecker picks an operation's entries (and the gaps) out of its
// partition's chain, read line by line oldest first, and checks each
// one's signature and link with keys. The zero value is not usable: see
// NewHistoryChecker.
type HistoryChecker struct {
	op      keyMatcher
	keys    *KeySet
	out     []Checked
	started bool   // an entry was read: last and head are its
	broken  string // why the chain cannot be followed into the next entry
	last    uint64
	head    string
	pending []int // entries of out that wait for a seal
	// installation is the id whose genesis a chain's first entry names
	// (GenesisDigest); "" when it was not read.
	installation string
}

// NewHistoryChecker checks the history of key with keys. key is the full
// key or the compact one a ledger lists (docs/protocol.md 6.2): the events
// naming either are its.
func NewHistoryChecker(key string, keys *KeySet) *HistoryChecker {
	return &HistoryChecker{op: newKeyMatcher(key), keys: keys}
}

// WithInstallation has h check a chain's first entry against the genesis
// of installation (GenesisDigest); without it, a first entry that names
// a genesis is not checked (CheckUnknown). It returns h.
func (h *HistoryChecker) WithInstallation(installation string) *HistoryChecker {
	h.installation = installation
	return h
}

// keyMatcher tells the events of one operation, named by its full key or
// its compact ledger key, given either.
type keyMatcher struct {
	compact string
	needles [][]byte // a line that names the operation contains one
}

func newKeyMatcher(key string) keyMatcher {
	compact, _ := intent.LedgerKey(key, intent.LayoutCompact)
	m := keyMatcher{compact: compact, needles: [][]byte{intent.AppendCanonicalString([]byte(`"key":`), compact)}}
	switch {
	case compact != key:
		m.needles = append(m.needles, intent.AppendCanonicalString([]byte(`"key":`), key))
	case intent.CompactLedgerKey(key):
		// The full key begins with the 16 digest bytes the compact one
		// holds, in hex.
		i := strings.LastIndexByte(key, '.')
		if b, err := base64.RawURLEncoding.DecodeString(key[i+1:]); err == nil {
			full := intent.AppendCanonicalString([]byte(`"key":`), key[:i+1]+hex.EncodeToString(b))
			m.needles = append(m.needles, full[:len(full)-1]) // without the closing quote: a prefix
		}
	}
	return m
}

// named reports whether line may hold an event of the operation.
func (m keyMatcher) named(line []byte) bool {
	for _, n := range m.needles {
		if bytes.Contains(line, n) {
			return true
		}
	}
	return false
}

// is reports whether an event's key names the operation.
func (m keyMatcher) is(key string) bool {
	c, err := intent.LedgerKey(key, intent.LayoutCompact)
	return err == nil && c == m.compact
}

// Add reads the next line of the partition's chain.
func (h *HistoryChecker) Add(line []byte) {
	named := h.op.named(line)
	pe, err := parseEntry(line)
	if err != nil {
		if named {
			h.out = append(h.out, Checked{Line: bytes.Clone(line), Partition: -1, Signature: CheckFailed,
				SignatureDetail: "the line is not an entry: " + err.Error(), Link: CheckFailed, LinkDetail: "the line is not an entry"})
		}
		h.breakChain("a line after it is not an entry", "the line before it is not an entry")
		return
	}
	ev, evErr := decodeEvent(pe.Event)
	mine := ev.Kind == KindGap || (named && (h.op.is(ev.Key) || evErr != nil))
	signed := mine && evErr == nil && hasMember(pe.Event, "sig")
	if signed {
		ev, evErr = VerifyEvent(pe.Event, h.keys)
	}
	c := Checked{Line: bytes.Clone(line), Partition: pe.Partition, Pos: pe.Pos, Event: ev}

	// Its place.
	switch {
	case !h.started && h.broken != "":
		c.Link, c.LinkDetail = CheckFailed, h.broken
	case !h.started && pe.Pos == 1 && pe.Prev == "":
		c.Link = CheckVerified // the first entry of a chain bound to no installation
	case !h.started && pe.Pos == 1 && h.installation != "" && pe.Prev == GenesisDigest(h.installation, pe.Partition):
		c.Link = CheckVerified // the chain's first entry, bound to its installation
	case !h.started && pe.Pos == 1 && h.installation == "":
		c.Link, c.LinkDetail = CheckUnknown, "the chain's first entry names a genesis; the installation's id was not read"
	case !h.started && pe.Pos == 1:
		c.Link, c.LinkDetail = CheckFailed, "the chain's first entry names neither this installation's genesis nor none"
	case !h.started:
		c.Link, c.LinkDetail = CheckUnknown, "the first entry read (the trail read starts here)"
	case pe.Pos == h.last+1 && pe.Prev == h.head:
		c.Link = CheckVerified
	case pe.Pos == h.last+1:
		c.Link, c.LinkDetail = CheckFailed, fmt.Sprintf("its prev is not the digest of position %d: one of them was changed", h.last)
	case pe.Pos <= h.last:
		c.Link, c.LinkDetail = CheckFailed, fmt.Sprintf("position %d comes after position %d: entries were moved or repeated", pe.Pos, h.last)
	default:
		c.Link, c.LinkDetail = CheckFailed, fmt.Sprintf("positions %d to %d are missing before it", h.last+1, pe.Pos-1)
	}
	if h.started && c.Link == CheckFailed {
		h.breakChain(fmt.Sprintf("the chain breaks after it, at position %d: no seal vouches for it", pe.Pos), "")
	}
	h.started, h.broken, h.last, h.head = true, "", pe.Pos, pe.digest

	// Its bytes.
	switch {
	case evErr != nil:
		c.Signature, c.SignatureDetail = CheckFailed, evErr.Error()
	case signed:
		c.Signature, c.Signer = CheckVerified, ev.Signer
	}
	if mine {
		h.out = append(h.out, c)
		if c.Signature == "" {
			h.pending = append(h.pending, len(h.out)-1)
		}
	}
	if pe.Seal != nil && len(h.pending) > 0 {
		err := verify(h.keys, pe.Seal.Signer, ev.At, pe.unsealed, pe.Seal.Sig)
		for _, i := range h.pending {
			if err != nil {
				h.out[i].Signature, h.out[i].SignatureDetail = CheckFailed, fmt.Sprintf("its append's seal (position %d): %v", pe.Pos, err)
			} else {
				h.out[i].Signature, h.out[i].Signer = CheckVerified, pe.Seal.Signer
			}
		}
		h.pending = h.pending[:0]
	}
}

// breakChain fails the entries waiting for a seal (no seal read later
// vouches for them) and, when next is not "", the link of the next entry.
func (h *HistoryChecker) breakChain(why, next string) {
	for _, i := range h.pending {
		h.out[i].Signature, h.out[i].SignatureDetail = CheckFailed, why
	}
	h.pending = h.pending[:0]
	if next != "" {
		h.started, h.broken = false, next
	}
}

// Entries returns the operation's entries and the gaps read, in the
// chain's order. An entry no seal followed fails: the trail read ends
// inside an append.
func (h *HistoryChecker) Entries() []Checked {
	h.breakChain("no seal follows it: the trail read ends inside an append", "")
	return h.out
}

// CheckedHistory reads the history of key as History does (its partition
// of a ledger of partitions partitions, appended since since) and checks
// it with keys: each entry of the operation, and each gap of its
// partition read, with what its signature and its link came to.
func CheckedHistory(ctx context.Context, js jetstream.JetStream, names intent.Names, partitions int, key string, since time.Time, keys *KeySet) ([]Checked, error) {
	h := NewHistoryChecker(key, keys)
	if id, err := ReadInstallation(ctx, js, names); err == nil {
		h.WithInstallation(id)
	}
	err := Read(ctx, js, names, Filter{Partition: intent.Partition(key, partitions), Since: since}, func(line []byte) error {
		h.Add(line)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h.Entries(), nil
}
