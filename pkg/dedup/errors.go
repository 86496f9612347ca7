package dedup

import "errors"

// Sentinel errors. Match them with errors.Is; the package wraps them with the
// key and operation they concern.
var (
	// ErrNotFound: the key has no record (it never existed, was released, or
	// aged out of the bucket).
	ErrNotFound = errors.New("dedup: record not found")

	// ErrLeaseLost: a lease write found another revision than the lease's own,
	// so another claimant took the record over (or it was moved on). The
	// write did not happen; the new holder's record is intact.
	ErrLeaseLost = errors.New("dedup: lease lost")

	// ErrLeaseDone: the lease was already completed, failed or released by
	// its holder; it cannot be used again.
	ErrLeaseDone = errors.New("dedup: lease already finished")

	// ErrReleased: while waiting, the record was deleted or purged (by an
	// operator or the bucket's TTL); claim again to retry the operation.
	ErrReleased = errors.New("dedup: record released")

	// ErrForgotten: while waiting, an operator forgot the operation (its
	// record became a forgotten tombstone, see Ledger.Forget); Wait's error
	// matches ErrReleased too: claim again to run it again.
	ErrForgotten = errors.New("dedup: operation forgotten")

	// ErrContended: the record kept changing underneath a claim for
	// maxClaimRounds rounds; the claim may be retried later.
	ErrContended = errors.New("dedup: record changed too often during claim")

	// ErrWrongState: an operator decision does not apply to the record's
	// status (approving a completed operation, resolving one that is not
	// uncertain); the record is unchanged.
	ErrWrongState = errors.New("dedup: decision does not apply to the record's status")

	// ErrFingerprintMismatch: an approval names another fingerprint than the
	// record's: the operator approved other arguments.
	ErrFingerprintMismatch = errors.New("dedup: approval is for other arguments")

	// ErrInvalid: an argument or configuration is invalid; the message says
	// which and how to fix it.
	ErrInvalid = errors.New("dedup: invalid argument")
)

// errRevisionMismatch: a compare-and-set write found another revision than
// the one it was made on, and wrote nothing. The ledger's methods report it
// in their own terms (a Lease write as ErrLeaseLost; a claim or a decision
// re-reads and decides again).
var errRevisionMismatch = errors.New("dedup: revision mismatch")
