package dedup

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Record is the ledger record of one key, stored as JSON in the ledger bucket.
// The record's KV revision (returned next to it) is its fencing token: every
// change is a compare-and-set on the revision it was read at.
type Record struct {
	// Status is the record's state; see the package documentation's diagram.
	Status intent.Status `json:"status"`
	// Tool is the tool the key belongs to.
	Tool string `json:"tool,omitempty"`
	// Session is the session (tenant scope) of the intent that claimed the
	// key, as its envelope gave it; "" for none. Front doors that give each
	// caller a session namespace check it before showing or deciding a
	// record.
	Session string `json:"session,omitempty"`
	// Fingerprint identifies the operation's full arguments. A claim with the
	// same key and another fingerprint is a conflict.
	Fingerprint string `json:"fingerprint"`
	// Holder identifies the claimant that holds (or last held) the lease;
	// empty once the holder released the key after a transient failure.
	Holder string `json:"holder,omitempty"`
	// LeaseUntil is the deadline of the holder's lease; after it another
	// claimant may take a pending record over. Zero when no lease is held.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Attempt counts claims of the key, takeovers included; 1-based.
	Attempt int `json:"attempt"`
	// Attempts counts invocations of the effect for this key, retries
	// included, as reported by the holder.
	Attempts int `json:"attempts"`
	// Result is the effect's result, set when Status is completed.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is the permanent error, set when Status is failed (or denied).
	Error *intent.Error `json:"error,omitempty"`
	// IntentSeq is the stream sequence of the intent message whose handling
	// made the latest claim.
	IntentSeq uint64 `json:"intent_seq,omitempty"`
	// CallID is the caller's informational call id of the claiming intent.
	CallID string `json:"call_id,omitempty"`
	// Submissions names the calls whose intents claimed the key
	// (ClaimRequest.Submission), the latest last, at most MaxSubmissions:
	// a copy of one of them is no new call (RanBy).
	Submissions []string `json:"submissions,omitempty"`
	// Intent is the intent envelope (JSON), kept while the operation awaits
	// approval so that an approval can fire it.
	Intent json.RawMessage `json:"intent,omitempty"`
	// Decision is the latest operator decision on the key: an approval, a
	// denial, or the resolution of an uncertain outcome.
	Decision *Decision `json:"decision,omitempty"`
	// Probe is the latest reconciliation probe's evidence: what the tool's
	// probe asked the downstream about the key and what came back, kept for
	// an operator. Nil when the key was never probed.
	Probe *Probe `json:"probe,omitempty"`
	// CreatedAt is when the key was first claimed.
	CreatedAt time.Time `json:"created_at"`
	// UpdatedAt is when the record was last written.
	UpdatedAt time.Time `json:"updated_at"`
	// CompletedAt is when the record reached completed or failed; zero before.
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// Receipt is the signed audit event of a final record's outcome
	// (completed, failed, denied), made by WithReceipts' function when the
	// outcome was written; every answer from the record carries it (see
	// pkg/audit). Empty on other records, when the ledger signs none, and
	// in a record read back that stores its Signature instead (see
	// SignedReceipt). Stored, when it is, as it is: a JSON object, checked
	// only to be one.
	Receipt json.RawMessage `json:"receipt,omitempty"`
	// Signature is what the record keeps of its receipt: the signature of
	// its outcome event (OutcomeEvent), which the record's members give
	// back.
	Signature *Signature `json:"signature,omitempty"`
	// RetentionSeconds is how long the record is kept once final, in
	// seconds: its tool's retention (ClaimRequest.Retention); 0 for the
	// ledger's (BucketConfig.TTL). An unresolved record never expires.
	RetentionSeconds int64 `json:"retention_seconds,omitempty"`
}

// LeaseExpired reports whether r is unanswered and its lease deadline is not
// after now, so that a claimant may take it over. An answered record (see
// intent.Status.Answered) never has an expired lease.
func (r Record) LeaseExpired(now time.Time) bool {
	if r.Status.Answered() {
		return false
	}
	return !now.Before(r.LeaseUntil)
}

// Decision is an operator's decision on a key, as recorded.
type Decision struct {
	// Op is approve, deny, resolve or, in a forgotten record, forget
	// (intent.ControlApprove, ...).
	Op string `json:"op"`
	// By names the operator, as given.
	By string `json:"by,omitempty"`
	// Reason is the operator's reason, as given.
	Reason string `json:"reason,omitempty"`
	// At is when the decision was recorded.
	At time.Time `json:"at"`
	// Until is when an approval lapses if the firing has not started.
	Until time.Time `json:"until,omitzero"`
}

// Probe is the evidence of a reconciliation probe, as recorded: whether
// the downstream had done the operation, by what it answered.
type Probe struct {
	// At is when the probe was answered (or gave up).
	At time.Time `json:"at"`
	// Key is the operation's key the probe asked about (a compact ledger
	// lists the record under its stored key only).
	Key string `json:"key"`
	// Verdict is done, not_done or unknown.
	Verdict string `json:"verdict"`
	// Request names what was asked, its secrets redacted:
	// "GET https://api.example/refunds?idempotency_key=…".
	Request string `json:"request"`
	// Status is the answer's status ("404 Not Found"), or why there was
	// none ("no answer within 5s").
	Status string `json:"status,omitempty"`
	// Body is the start of the answer, clipped.
	Body string `json:"body,omitempty"`
}

// ProbeDone is the verdict of a probe that found the operation done
// downstream (the others are "not_done" and "unknown").
const ProbeDone = "done"

// MaxSubmissions is how many calls a record names (Record.Submissions):
// the oldest is dropped past it.
const MaxSubmissions = 16

// RanBy reports whether the call that made intent message seq, named
// submission ("" when it names none), claimed r's key already: the intent
// is the latest claimant's message itself (delivered again), or a copy of a
// call that claimed it (republished, repeated by a front door). Such an
// intent is no new call: the outcome it finds is its own call's.
func (r Record) RanBy(seq uint64, submission string) bool {
	if seq != 0 && seq == r.IntentSeq {
		return true
	}
	return submission != "" && slices.Contains(r.Submissions, submission)
}

// CausedBy reports whether r's latest claim was made by the call that made
// intent message seq, named submission: the message itself, or a copy of
// the same call. An answer from r to that call is no replay.
func (r Record) CausedBy(seq uint64, submission string) bool {
	if seq != 0 && seq == r.IntentSeq {
		return true
	}
	return submission != "" && len(r.Submissions) > 0 && r.Submissions[len(r.Submissions)-1] == submission
}

// Approved reports whether r carries an approval still valid at now.
func (r Record) Approved(now time.Time) bool {
	return r.Decision != nil && r.Decision.Op == intent.ControlApprove && now.Before(r.Decision.Until)
}

// Released reports whether r was given up by its holder after a transient
// failure (Lease.Release): pending, with no holder.
func (r Record) Released() bool {
	return r.Status == intent.StatusPending && r.Holder == ""
}

// Caller is whom an answer is for: the operation's key, and the calling
// intent's fingerprint, tool and informational call id.
type Caller struct {
	Key         string // the operation's key, as the caller named it
	Fingerprint string // "" for an operator's decision, which names no arguments
	Tool        string // default: the record's tool
	CallID      string // the calling intent's call id, echoed in the answer
	// RejectRepeat answers a completed record that another call caused
	// already_done rather than with its result as a replay: the tool's
	// intent.OnCompleteReject.
	RejectRepeat bool
}

// Answer is the answer r gives c: the record's outcome or, when c's
// fingerprint is not the record's (the key was first used with other
// arguments), a conflict — never fired, and an answer about c's own call,
// so not a replay. replayed reports that the record's outcome was caused by
// another call than c's. A replayed completion, for a caller whose tool
// rejects repeats (Caller.RejectRepeat), is answered already_done: error
// code already_done, with the recorded result, completion time and attempts
// of what ran.
func (r Record) Answer(c Caller, replayed bool) intent.Result {
	tool := c.Tool
	if tool == "" {
		tool = r.Tool
	}
	if c.Fingerprint != "" && c.Fingerprint != r.Fingerprint {
		return intent.Result{
			Key:               c.Key,
			Tool:              tool,
			Status:            intent.StatusConflict,
			Fingerprint:       c.Fingerprint,
			RecordFingerprint: r.Fingerprint,
			Error: &intent.Error{Code: intent.CodeConflict, Message: fmt.Sprintf(
				"key %s was first used with other arguments (fingerprint %s, this intent's %s)",
				c.Key, r.Fingerprint, c.Fingerprint)},
			CallID:      c.CallID,
			CompletedAt: time.Now().UTC(),
		}
	}
	var at time.Time // only a final answer has a completion time, and names its run
	var seq uint64
	var attempt int
	if r.Status.Final() {
		at = r.CompletedAt
		if at.IsZero() {
			at = r.UpdatedAt
		}
		seq, attempt = r.IntentSeq, r.Attempt
	}
	res := intent.Result{
		Key:         c.Key,
		Tool:        tool,
		Status:      r.Status,
		Replayed:    replayed,
		Fingerprint: r.Fingerprint,
		Attempts:    r.Attempts,
		IntentSeq:   seq,
		Attempt:     attempt,
		Result:      r.Result,
		Error:       r.Error,
		CallID:      c.CallID,
		CompletedAt: at,
		Receipt:     r.receiptOf(),
	}
	if replayed && c.RejectRepeat && r.Status == intent.StatusCompleted {
		res.Status = intent.StatusAlreadyDone
		res.Error = &intent.Error{Code: intent.CodeAlreadyDone, Message: fmt.Sprintf(
			"the operation already ran: completed at %s after %d attempt(s); this tool refuses to run it again, "+
				"and the answer carries the recorded result — a new operation needs other arguments or a new key",
			at.UTC().Format(time.RFC3339), r.Attempts)}
	}
	return res
}

// receiptOf is the receipt an answer from r carries: r's, when r is final.
func (r Record) receiptOf() json.RawMessage {
	if !r.Status.Final() {
		return nil
	}
	return r.SignedReceipt()
}

// Signature is the signature of a final record's outcome event, which with
// the record's members gives its receipt: the members of the event the
// record cannot give, and what signing added (audit.Signature).
type Signature struct {
	// Key is the key the outcome was written under (the operation's, or
	// the compact ledger key an operator named).
	Key string `json:"key"`
	// Holder is the claimant that wrote the outcome, when it is not the
	// record's holder.
	Holder string `json:"holder,omitempty"`
	Signer string `json:"signer"`
	Sig    string `json:"sig"`
	// Proof is the event's Merkle proof (audit.CompactProof).
	Proof string `json:"proof,omitempty"`
}

// OutcomeEvent is the outcome event of r written under key by writer,
// unsigned: what r's receipt signs. An operator's decision that made the
// outcome (recorded at its completion time; not an approval) is in it.
func (r Record) OutcomeEvent(key, writer string) audit.Event {
	ev := audit.Outcome(key, r.Tool, r.Session, r.Fingerprint, r.Status, r.Result, r.Error, r.Attempts, r.IntentSeq, r.CompletedAt)
	ev.Holder, ev.Attempt = writer, r.Attempt
	if d := r.Decision; d != nil && d.At.Equal(r.CompletedAt) && d.Op != intent.ControlApprove {
		ev.Op, ev.By, ev.Reason = d.Op, d.By, d.Reason
	}
	return ev
}

// SignedReceipt is r's receipt: Receipt, or the one r's Signature and
// members give; nil when r has neither (or a malformed Signature, which
// no receipt can come from).
func (r Record) SignedReceipt() json.RawMessage {
	s := r.Signature
	if len(r.Receipt) > 0 || s == nil {
		return r.Receipt
	}
	proof, err := audit.ParseCompactProof(s.Proof)
	if err != nil {
		return nil
	}
	writer := r.Holder
	if s.Holder != "" {
		writer = s.Holder
	}
	return r.OutcomeEvent(s.Key, writer).Signed(audit.Signature{Signer: s.Signer, Sig: s.Sig, Proof: proof})
}

// decodeRecord decodes a ledger record as stored in the bucket (a KV
// entry's value).
func decodeRecord(data []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, fmt.Errorf("%w: ledger record: %w", ErrInvalid, err)
	}
	return r, nil
}
