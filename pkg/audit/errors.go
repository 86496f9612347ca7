package audit

import "errors"

// Errors of the package; match them with errors.Is.
var (
	// ErrInvalid: malformed input — an event, an entry, a keys file or a
	// key that is not what it must be.
	ErrInvalid = errors.New("audit: invalid")
	// ErrBadSignature: a signature does not verify: the signed bytes were
	// changed, or another key signed them.
	ErrBadSignature = errors.New("audit: bad signature")
	// ErrUnknownSigner: the signer's key is not among the keys given.
	ErrUnknownSigner = errors.New("audit: unknown signer")
	// ErrKeyNotValid: the signer's key is known but not valid at the
	// event's time (see PublicKey's NotBefore and NotAfter).
	ErrKeyNotValid = errors.New("audit: signer key not valid then")
	// ErrNoReceipt: an answer that must carry a receipt carries none.
	ErrNoReceipt = errors.New("audit: no receipt")
	// ErrReceiptMismatch: a receipt verifies but records another
	// operation or outcome than the answer's.
	ErrReceiptMismatch = errors.New("audit: receipt does not match the answer")
)
