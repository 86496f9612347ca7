package audit

import (
	"encoding/json"
	"fmt"
)

// Signature is what signing adds to an event: the signer's key id, the
// signature and the event's Merkle proof (see SignBatch). A ledger record
// keeps its receipt as its signature and rebuilds the receipt from its own
// members (Event.Signed), instead of storing the signed event's bytes.
type Signature struct {
	Signer string
	Sig    string
	// Proof is the proof packed: 33 bytes a step, its side ('L' or 'R')
	// and its sibling's hash.
	Proof []byte
}

// Signed returns e signed with s: its canonical JSON with s's signer,
// signature and proof, the bytes Sign returned for it when e has the
// members it had then.
func (e Event) Signed(s Signature) json.RawMessage {
	e.Signer, e.Sig, e.Proof = s.Signer, s.Sig, unpack(s.Proof)
	return e.Canonical()
}

// CompactProof is a packed proof (Signature.Proof) in base64url, without
// padding; ParseCompactProof reads it.
func CompactProof(packed []byte) string { return b64.EncodeToString(packed) }

// ParseCompactProof decodes CompactProof's encoding into a packed proof.
func ParseCompactProof(s string) ([]byte, error) {
	packed, err := b64.DecodeString(s)
	if err != nil || len(packed)%stepSize != 0 {
		return nil, fmt.Errorf("%w: compact proof: want base64url of %d bytes a step", ErrInvalid, stepSize)
	}
	for i := 0; i < len(packed); i += stepSize {
		if packed[i] != 'L' && packed[i] != 'R' {
			return nil, fmt.Errorf("%w: compact proof: a step's side is L or R", ErrInvalid)
		}
	}
	return packed, nil
}
