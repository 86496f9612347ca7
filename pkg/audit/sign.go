package audit

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
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

// merkle returns the root over leaves and each leaf's proof. At each level
// adjacent nodes pair up; an odd last node goes up as it is.
func merkle(leaves [][32]byte) (root [32]byte, proofs [][]string) {
	proofs = make([][]string, len(leaves))
	pos := make([]int, len(leaves)) // each leaf's node at the current level
	for i := range pos {
		pos[i] = i
	}
	level := leaves
	steps := make([]string, len(leaves)) // each node's step at the current level, made once for the leaves below its sibling
	for len(level) > 1 {
		clear(steps[:len(level)])
		for i, p := range pos {
			sib := p ^ 1
			if sib < len(level) {
				if steps[sib] == "" {
					side := "R"
					if p%2 == 1 {
						side = "L"
					}
					steps[sib] = side + hex.EncodeToString(level[sib][:])
				}
				if proofs[i] == nil {
					proofs[i] = make([]string, 0, bits.Len(uint(len(leaves)-1)))
				}
				proofs[i] = append(proofs[i], steps[sib])
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

// fold computes the root from a leaf and its proof.
func fold(leaf [32]byte, proof []string) ([32]byte, error) {
	h := leaf
	for _, step := range proof {
		var sib [32]byte
		if len(step) != 65 {
			return h, fmt.Errorf("%w: proof step %q: want L or R and 64 hex digits", ErrInvalid, step)
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
	leaves := make([][32]byte, len(events))
	marks := make([]sigMarks, len(events))
	spans := make([][2]int, len(events))
	// One buffer for the events' encodings without signature, each after
	// the leaf's 0x00, hashed as it is.
	n := 0
	for i := range events {
		events[i].Signer, events[i].Sig, events[i].Proof = s.id, "", nil
		n += events[i].sizeHint() + 1
	}
	buf := make([]byte, 0, n)
	for i := range events {
		buf = append(buf, 0)
		start := len(buf)
		var m sigMarks
		buf, m = events[i].appendCanonicalMarked(buf, false)
		spans[i], marks[i] = [2]int{start, len(buf)}, sigMarks{proof: m.proof - start, sig: m.sig - start}
		leaves[i] = sha256.Sum256(buf[start-1:])
	}
	root, proofs := merkle(leaves)
	sig := s.sign(root[:])
	out := make([]json.RawMessage, len(events))
	for i := range events {
		events[i].Sig, events[i].Proof = sig, proofs[i]
		out[i] = withSignature(buf[spans[i][0]:spans[i][1]], marks[i], proofs[i], sig)
	}
	return out
}

// withSignature returns the canonical JSON of a signed event from its
// canonical JSON without "sig" and "proof" (and where they go, m): the
// same members with those two inserted in their places.
func withSignature(unsigned []byte, m sigMarks, proof []string, sig string) []byte {
	n := len(unsigned) + 10 + len(sig)
	for _, step := range proof {
		n += len(step) + 3
	}
	b := make([]byte, 0, n+12)
	b = append(b, unsigned[:m.proof]...)
	if len(proof) > 0 {
		b = append(b, `,"proof":[`...)
		for i, step := range proof {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, step)
		}
		b = append(b, ']')
	}
	b = append(b, unsigned[m.proof:m.sig]...)
	if sig != "" {
		b = append(b, `,"sig":`...)
		b = appendString(b, sig)
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
			return me.out
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

	events := make([]Event, len(batch))
	for i, p := range batch {
		events[i] = p.ev
	}
	for i, out := range b.s.SignBatch(events) {
		batch[i].out = out
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
	return me.out
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
func VerifyEvent(raw []byte, keys *KeySet) (Event, error) {
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
	if err := verify(keys, ev.Signer, ev.At, root[:], ev.Sig); err != nil {
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

// verify checks sig (base64url) over msg with key id, valid at at.
func verify(keys *KeySet, id string, at time.Time, msg []byte, sig string) error {
	pub, err := keys.lookup(id, at)
	if err != nil {
		return err
	}
	raw, err := b64.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize || !ed25519.Verify(pub, msg, raw) {
		return fmt.Errorf("%w: signer %s", ErrBadSignature, id)
	}
	return nil
}
