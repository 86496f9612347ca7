package audit

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"time"
)

// Sign returns e signed by s: its canonical JSON (RFC 8785) with "signer"
// set to s's key id and "sig" the Ed25519 signature of the canonical JSON
// without "sig". Anyone with s's public key verifies it (VerifyEvent)
// without the trail around it: a signed outcome is a receipt.
func (s *Signer) Sign(e Event) json.RawMessage {
	e.Signer, e.Sig = s.id, ""
	o := e.object()
	msg := o.appendTo(make([]byte, 0, len(o.buf)+24*len(o.members)))
	o.str("sig", s.sign(msg))
	return o.appendTo(make([]byte, 0, len(msg)+100))
}

// VerifyEvent checks the signature of a signed event (as Sign returns it)
// with the key its "signer" names in keys, valid at its "at", and returns
// the event. It returns an error matching ErrInvalid (not an event, not
// canonicalizable), ErrBadSignature (unsigned, or the bytes or signature
// changed), ErrUnknownSigner or ErrKeyNotValid.
func VerifyEvent(raw []byte, keys *KeySet) (Event, error) {
	msg, sigJSON, err := withoutMember(raw, "sig")
	if err != nil {
		return Event{}, fmt.Errorf("event: %w", err)
	}
	ev, err := decodeEvent(raw)
	if err != nil {
		return Event{}, err
	}
	if sigJSON == nil || ev.Signer == "" {
		return ev, fmt.Errorf("%w: the event is not signed", ErrBadSignature)
	}
	if err := verify(keys, ev.Signer, ev.At, msg, ev.Sig); err != nil {
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
