package audit

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// A signed event (a receipt) carries "signer", "sig" and, when it was
// signed in a batch, "proof". Its signature is the Ed25519 signature of a
// Merkle root (32 bytes) over the events signed together:
//
//	leaf  = SHA-256(0x00 || JCS(event without "sig" and "proof"))
//	node  = SHA-256(0x01 || left || right)
//	root  = the leaf itself when the event was signed alone, else the
//	        leaf folded with each proof step in turn: "L<hex>" is a left
//	        sibling (node(sibling, h)), "R<hex>" a right one (node(h, sibling))
//
// so one signature covers every receipt a worker made at once, and each
// receipt still verifies alone, with the signer's public key.

// leafHash is the Merkle leaf of an event's canonical JSON (without sig
// and proof).
func leafHash(canonical []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte{0})
	h.Write(canonical)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func nodeHash(left, right [32]byte) [32]byte {
	var buf [65]byte
	buf[0] = 1
	copy(buf[1:], left[:])
	copy(buf[33:], right[:])
	return sha256.Sum256(buf[:])
}

// stepSize is the size of a packed proof step: the sibling's side ('L' or
// 'R') and its hash.
const stepSize = 33

// merkle returns the root over leaves and each leaf's proof, packed
// (stepSize bytes a step). At each level adjacent nodes pair up; an odd
// last node goes up as it is.
func merkle(leaves [][32]byte) (root [32]byte, proofs [][]byte) {
	proofs = make([][]byte, len(leaves))
	depth := bits.Len(uint(len(leaves) - 1))
	packed := make([]byte, len(leaves)*depth*stepSize) // every proof's, one after the other
	pos := make([]int, len(leaves))                    // each leaf's node at the current level
	for i := range pos {
		pos[i] = i
		proofs[i] = packed[i*depth*stepSize : i*depth*stepSize : (i+1)*depth*stepSize]
	}
	level := leaves
	for len(level) > 1 {
		for i, p := range pos {
			if sib := p ^ 1; sib < len(level) {
				side := byte('R')
				if p%2 == 1 {
					side = 'L'
				}
				proofs[i] = append(append(proofs[i], side), level[sib][:]...)
			}
			pos[i] = p / 2
		}
		next := make([][32]byte, 0, (len(level)+1)/2)
		for j := 0; j < len(level); j += 2 {
			if j+1 < len(level) {
				next = append(next, nodeHash(level[j], level[j+1]))
			} else {
				next = append(next, level[j])
			}
		}
		level = next
	}
	return level[0], proofs
}

// appendSteps appends a packed proof's steps as JSON strings ("L<hex>",
// "R<hex>"), comma-separated.
func appendSteps(b, packed []byte) []byte {
	for i := 0; i+stepSize <= len(packed); i += stepSize {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"', packed[i])
		b = hex.AppendEncode(b, packed[i+1:i+stepSize])
		b = append(b, '"')
	}
	return b
}

// unpack returns a packed proof's steps as strings.
func unpack(packed []byte) []string {
	var steps []string
	for i := 0; i+stepSize <= len(packed); i += stepSize {
		steps = append(steps, string(packed[i])+hex.EncodeToString(packed[i+1:i+stepSize]))
	}
	return steps
}

// fold computes the root from a leaf and its proof.
func fold(leaf [32]byte, proof []string) ([32]byte, error) {
	h := leaf
	for _, step := range proof {
		var sib [32]byte
		if len(step) != 65 || strings.IndexFunc(step[1:], func(r rune) bool { return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') }) >= 0 {
			return h, fmt.Errorf("%w: proof step %q: want L or R and 64 lowercase hex digits", ErrInvalid, step)
		}
		if _, err := hex.Decode(sib[:], []byte(step[1:])); err != nil {
			return h, fmt.Errorf("%w: proof step %q: %w", ErrInvalid, step, err)
		}
		switch step[0] {
		case 'L':
			h = nodeHash(sib, h)
		case 'R':
			h = nodeHash(h, sib)
		default:
			return h, fmt.Errorf("%w: proof step %q: want L or R first", ErrInvalid, step)
		}
	}
	return h, nil
}

// Sign returns e signed by s alone: its canonical JSON (RFC 8785) with
// "signer" set to s's key id and "sig" the signature of its leaf hash.
// Anyone with s's public key verifies it (VerifyEvent) without the trail
// around it: a signed outcome is a receipt.
func (s *Signer) Sign(e Event) json.RawMessage {
	return s.SignBatch([]Event{e})[0]
}

// SignBatch signs events with one signature (see the Merkle tree above):
// each returned event carries the signature and its proof, and verifies
// alone.
func (s *Signer) SignBatch(events []Event) []json.RawMessage {
	ptrs := make([]*Event, len(events))
	for i := range events {
		ptrs[i] = &events[i]
	}
	out, _ := s.signBatch(ptrs)
	return out
}

// signBatch is SignBatch over the events pointed to (it sets their
// signer), and what it added to each.
func (s *Signer) signBatch(events []*Event) ([]json.RawMessage, []Signature) {
	leaves := make([][32]byte, len(events))
	marks := make([]sigMarks, len(events))
	spans := make([][2]int, len(events))
	// One buffer for the events' encodings without signature, each after
	// the leaf's 0x00, hashed as it is.
	n := 0
	for _, e := range events {
		e.Signer, e.Sig, e.Proof = s.id, "", nil
		n += e.sizeHint() + 1
	}
	buf := make([]byte, 0, n)
	for i, e := range events {
		buf = append(buf, 0)
		start := len(buf)
		var m sigMarks
		buf, m = e.appendCanonicalMarked(buf, false)
		spans[i], marks[i] = [2]int{start, len(buf)}, sigMarks{proof: m.proof - start, sig: m.sig - start}
		leaves[i] = sha256.Sum256(buf[start-1:])
	}
	root, proofs := merkle(leaves)
	sig := s.sign(root[:])
	// One buffer for the signed events too, each capped at its end.
	size := 0
	for i := range events {
		size += signedSize(spans[i][1]-spans[i][0], len(proofs[i])/stepSize, sig)
	}
	signed := make([]byte, 0, size)
	out := make([]json.RawMessage, len(events))
	sigs := make([]Signature, len(events))
	for i := range events {
		start := len(signed)
		signed = appendWithSignature(signed, buf[spans[i][0]:spans[i][1]], marks[i], proofs[i], sig)
		out[i] = signed[start:len(signed):len(signed)]
		sigs[i] = Signature{Signer: s.id, Sig: sig, Proof: proofs[i]}
	}
	return out, sigs
}

// signedSize is the length of an event's canonical JSON of n bytes without
// "sig" and "proof", with sig and a proof of steps steps.
func signedSize(n, steps int, sig string) int {
	if sig != "" {
		n += len(`,"sig":""`) + len(sig)
	}
	if steps > 0 {
		n += len(`,"proof":[]`) + steps*(2*stepSize+2) - 1 // each step quoted, a comma between two
	}
	return n
}

// appendWithSignature appends the canonical JSON of a signed event, from
// its canonical JSON without "sig" and "proof" (and where they go, m): the
// same members with those two inserted in their places.
func appendWithSignature(b, unsigned []byte, m sigMarks, proof []byte, sig string) []byte {
	b = append(b, unsigned[:m.proof]...)
	if len(proof) > 0 {
		b = append(appendSteps(append(b, `,"proof":[`...), proof), ']')
	}
	b = append(b, unsigned[m.proof:m.sig]...)
	if sig != "" {
		b = append(b, `,"sig":`...)
		b = intent.AppendCanonicalString(b, sig)
	}
	return append(b, unsigned[m.sig:]...)
}

// batchHot is how recently a BatchSigner must have signed for a caller to
// expect company: receipts are coming, so before it signs it lets the other
// goroutines run once (they may be about to queue theirs). Otherwise it
// signs at once.
const batchHot = 500 * time.Microsecond

// BatchSigner signs the events of concurrent callers together, with one
// signature (Signer.SignBatch): one caller at a time signs, for itself and
// every caller queued behind it, then hands the signing to the next caller
// queued. While receipts keep coming it first yields to the other
// goroutines, so that under load one signature covers many; alone, an
// event is signed at once. It never waits on a clock. It is safe for
// concurrent use.
type BatchSigner struct {
	s       *Signer
	mu      sync.Mutex
	queue   []*signing
	busy    bool      // a caller is signing
	lastEnd time.Time // when the last signature was made
	// Counts, for Stats.
	events, signatures atomic.Uint64
}

type signing struct {
	ev  Event
	out json.RawMessage
	sig Signature
	// done is sent on when out is set, or when the caller is to sign next
	// (out still nil).
	done chan struct{}
}

// signings are reused: a signing is done with when its caller returns (the
// signing caller never touches another's after waking it).
var signings = sync.Pool{New: func() any { return &signing{done: make(chan struct{}, 1)} }}

// NewBatchSigner returns a batch signer with s's key.
func NewBatchSigner(s *Signer) *BatchSigner { return &BatchSigner{s: s} }

// Signer returns the signer whose key signs.
func (b *BatchSigner) Signer() *Signer { return b.s }

// Sign returns e signed, with the events of the callers signing at the
// same time (see SignBatch).
func (b *BatchSigner) Sign(e Event) json.RawMessage {
	out, _ := b.SignSealed(e)
	return out
}

// SignSealed is Sign, and the signature it added to e.
func (b *BatchSigner) SignSealed(e Event) (json.RawMessage, Signature) {
	me := signings.Get().(*signing)
	me.ev = e
	defer func() {
		*me = signing{done: me.done}
		signings.Put(me)
	}()
	b.mu.Lock()
	b.queue = append(b.queue, me)
	if b.busy {
		b.mu.Unlock()
		<-me.done
		if me.out != nil {
			return me.out, me.sig
		}
		b.mu.Lock() // handed the signing
	}
	b.busy = true
	if time.Since(b.lastEnd) < batchHot {
		b.mu.Unlock()
		runtime.Gosched()
		b.mu.Lock()
	}
	batch := b.queue
	b.queue = nil
	b.mu.Unlock()

	events := make([]*Event, len(batch))
	for i, p := range batch {
		events[i] = &p.ev
	}
	out, sigs := b.s.signBatch(events)
	for i, p := range batch {
		p.out, p.sig = out[i], sigs[i]
	}
	b.events.Add(uint64(len(events)))
	b.signatures.Add(1)

	b.mu.Lock()
	b.lastEnd = time.Now()
	if len(b.queue) > 0 {
		b.queue[0].done <- struct{}{} // the next caller signs
	} else {
		b.busy = false
	}
	b.mu.Unlock()
	for _, p := range batch {
		if p != me {
			p.done <- struct{}{}
		}
	}
	return me.out, me.sig
}

// Stats returns how many events the batch signer signed, and with how
// many signatures.
func (b *BatchSigner) Stats() (events, signatures uint64) {
	return b.events.Load(), b.signatures.Load()
}

// VerifyEvent checks the signature of a signed event (as Sign or
// SignBatch return it) with the key its "signer" names in keys, valid at
// its "at", and returns the event. It returns an error matching ErrInvalid
// (not an event, not canonicalizable, a malformed proof), ErrBadSignature
// (unsigned, or the bytes, proof or signature changed), ErrUnknownSigner or
// ErrKeyNotValid.
func VerifyEvent(raw []byte, keys *KeySet) (Event, error) { return verifyEvent(raw, keys, nil) }

// verifyEvent is VerifyEvent, skipping a signature cache verified already.
func verifyEvent(raw []byte, keys *KeySet, cache *sigCache) (Event, error) {
	msg, removed, err := withoutMembers(raw, "sig", "proof")
	if err != nil {
		return Event{}, fmt.Errorf("event: %w", err)
	}
	ev, err := decodeEvent(raw)
	if err != nil {
		return Event{}, err
	}
	if removed["sig"] == nil || ev.Signer == "" {
		return ev, fmt.Errorf("%w: the event is not signed", ErrBadSignature)
	}
	var proof []string
	if p := removed["proof"]; p != nil {
		if err := json.Unmarshal(p, &proof); err != nil {
			return ev, fmt.Errorf("%w: event proof: %w", ErrInvalid, err)
		}
	}
	root, err := fold(leafHash(msg), proof)
	if err != nil {
		return ev, fmt.Errorf("event: %w", err)
	}
	if err := cache.verify(keys, ev.Signer, ev.At, root[:], ev.Sig); err != nil {
		return ev, fmt.Errorf("event: %w", err)
	}
	return ev, nil
}

// decodeEvent decodes an event's JSON: members it does not know are
// ignored (the set of kinds and members is open), an "at" is required.
func decodeEvent(raw []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: event: %w", ErrInvalid, err)
	}
	if ev.Kind == "" || ev.At.IsZero() {
		return ev, fmt.Errorf("%w: event: no kind or no at", ErrInvalid)
	}
	return ev, nil
}

// verify checks sig over msg with key id, valid at at. sig is the
// signature's one text: 86 characters of base64url without padding, whose
// unused last bits are zero (sigText).
func verify(keys *KeySet, id string, at time.Time, msg []byte, sig string) error {
	return (*sigCache)(nil).verify(keys, id, at, msg, sig)
}

// sigCache holds the signatures a verification checked lately (receipts
// signed together share one: see SignBatch), so that each is checked once.
// A nil cache holds none. It is safe for concurrent use.
type sigCache struct {
	mu   sync.Mutex
	seen map[[32]byte]struct{}
}

// sigCacheSize bounds a sigCache: signatures shared are those of events
// made at once, which lie close together in a trail.
const sigCacheSize = 4096

// verify is the package's verify, skipping the Ed25519 check of a
// signature of the same key, message and bytes checked before (the key's
// validity at at is checked every time).
func (c *sigCache) verify(keys *KeySet, id string, at time.Time, msg []byte, sig string) error {
	pub, err := keys.lookup(id, at)
	if err != nil {
		return err
	}
	var k [32]byte
	if c != nil {
		var buf [256]byte
		k = sha256.Sum256(append(append(append(buf[:0], pub...), msg...), sig...))
		c.mu.Lock()
		_, ok := c.seen[k]
		c.mu.Unlock()
		if ok {
			return nil
		}
	}
	raw, ok := sigText(sig)
	if !ok || !ed25519.Verify(pub, msg, raw) {
		return fmt.Errorf("%w: signer %s", ErrBadSignature, id)
	}
	if c != nil {
		c.mu.Lock()
		if c.seen == nil || len(c.seen) >= sigCacheSize {
			c.seen = make(map[[32]byte]struct{}, sigCacheSize)
		}
		c.seen[k] = struct{}{}
		c.mu.Unlock()
	}
	return nil
}

// sigText decodes a signature's text: exactly 86 characters of the
// base64url alphabet (no padding, no line breaks, which Go's decoder would
// skip), its last character's 4 unused bits zero, so that one signature
// has one text.
func sigText(sig string) ([]byte, bool) {
	if len(sig) != b64.EncodedLen(ed25519.SignatureSize) {
		return nil, false
	}
	for i := 0; i < len(sig); i++ {
		if c := sig[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return nil, false
		}
	}
	raw, err := b64.Strict().DecodeString(sig)
	return raw, err == nil && len(raw) == ed25519.SignatureSize
}
