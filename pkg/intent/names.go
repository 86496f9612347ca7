package intent

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DefaultPrefix is the prefix of every name idemgate uses on NATS.
const DefaultPrefix = "IDEM"

// Header names idemgate reads and writes on NATS messages.
const (
	// HeaderMsgID is JetStream's publish-dedup header; clients set it to the key.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderReplyTo names the subject a caller wants its answer pushed to.
	HeaderReplyTo = "Idem-Reply-To"
	// HeaderKey and HeaderFingerprint carry the key and fingerprint the
	// client derived. A worker that derives others rejects the intent
	// (CodeKeyMismatch). An answer never copies them: they are the caller's
	// word, and anyone may send another caller's.
	HeaderKey         = "Idem-Key"
	HeaderFingerprint = "Idem-Fingerprint"
	// HeaderIntentSeq is set by a worker on every answer it pushes: the
	// stream sequence of the message whose Idem-Reply-To it answers (an
	// intent, or an operator decision). A client takes a pushed answer only
	// when it is the sequence of one of its own stored publishes.
	HeaderIntentSeq = "Idem-Intent-Seq"
	// HeaderIntentTime is the time a window tool's key is derived from when
	// the envelope has no created_at, in place of the message's own
	// timestamp: a dead letter keeps its original's, so that a replay
	// derives the same key (RFC 3339).
	HeaderIntentTime = "Idem-Intent-Time"
	// HeaderSubmission names the call an intent belongs to: a client sets
	// one random value (ValidSubmission) on every publish of one call — the
	// first, each republish, and the repeats a front door makes for it — and
	// a new value for each new call. A worker records the calls that ran an
	// operation, so that a copy of a call whose run failed is answered with
	// the failure and only a new call runs it again (OnFailureRetry).
	HeaderSubmission = "Idem-Submission"

	// A dead letter carries these besides the original message's headers.
	HeaderDLQReason    = "Idem-Dlq-Reason"     // why the intent was dead-lettered
	HeaderDLQSubject   = "Idem-Dlq-Subject"    // the subject it was published on
	HeaderDLQStreamSeq = "Idem-Dlq-Stream-Seq" // its sequence in the work stream
	HeaderDLQDelivered = "Idem-Dlq-Delivered"  // how many times it was delivered
	HeaderDLQTime      = "Idem-Dlq-Time"       // when it was dead-lettered (RFC 3339)
	HeaderDLQMsgID     = "Idem-Dlq-Msg-Id"     // its Nats-Msg-Id, if it had one
)

var prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

var submissionPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{8,64}$`)

// ValidSubmission reports whether s may name a call (HeaderSubmission): 8 to
// 64 characters of [A-Za-z0-9_-], such as a NUID or 16 random bytes in hex.
func ValidSubmission(s string) bool { return submissionPattern.MatchString(s) }

// Names are the subjects, stream, consumer and bucket of one idemgate
// installation, all derived from a single prefix so that one setting renames
// them together.
type Names struct {
	Prefix        string // as given, e.g. "IDEM"
	Stream        string // "IDEM_INTENTS"
	Subjects      string // "idem.intents.>"
	Control       string // "idem.control.>": operator decisions (approve, deny, resolve, probe) and users' (user.approve, user.deny)
	Consumer      string // "IDEM_WORKERS"
	Bucket        string // "IDEM_LEDGER"
	DLQStream     string // "IDEM_DLQ"
	ToolsSubject  string // "idem.tools": the tool catalogue service
	AuditStream   string // "IDEM_AUDIT": the audit trail (see AuditSubject)
	AuditKeys     string // "IDEM_AUDIT_KEYS": the bucket of the workers' public signing keys
	subjectPrefix string // "idem.intents."
	dlqPrefix     string // "idem.dlq."
	controlPrefix string // "idem.control."
	auditPrefix   string // "idem.audit."
}

// NewNames derives the names for prefix ("" means DefaultPrefix). A prefix is
// 1-32 characters of letters, digits, '_' and '-'.
func NewNames(prefix string) (Names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(prefix) {
		return Names{}, fmt.Errorf("%w: prefix %q: use 1-32 letters, digits, '_' or '-'", ErrInvalid, prefix)
	}
	up, low := strings.ToUpper(prefix), strings.ToLower(prefix)
	return Names{
		Prefix:        prefix,
		Stream:        up + "_INTENTS",
		Subjects:      low + ".intents.>",
		Control:       low + ".control.>",
		Consumer:      up + "_WORKERS",
		Bucket:        up + "_LEDGER",
		DLQStream:     up + "_DLQ",
		ToolsSubject:  low + ".tools",
		AuditStream:   up + "_AUDIT",
		AuditKeys:     up + "_AUDIT_KEYS",
		subjectPrefix: low + ".intents.",
		dlqPrefix:     low + ".dlq.",
		controlPrefix: low + ".control.",
		auditPrefix:   low + ".audit.",
	}, nil
}

// IntentSubject is the subject intents for tool are published on.
func (n Names) IntentSubject(tool string) string { return n.subjectPrefix + tool }

// DLQSubject is the subject dead letters of tool are kept under.
func (n Names) DLQSubject(tool string) string { return n.dlqPrefix + tool }

// ToolFromSubject returns the tool token of an intent subject: the rest of the
// subject after the intents prefix ("" when subject is not an intent subject).
func (n Names) ToolFromSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, n.subjectPrefix)
	if !ok {
		return ""
	}
	return rest
}

// DLQSubjects is the subject filter of the dead-letter stream.
func (n Names) DLQSubjects() string { return n.dlqPrefix + ">" }

// ControlSubject is the subject a decision op (ControlApprove, ControlDeny,
// ControlResolve, ControlProbe, ControlUserApprove, ControlUserDeny) is
// published on: "idem.control.approve", "idem.control.user.approve".
func (n Names) ControlSubject(op string) string { return n.controlPrefix + op }

// ControlOp returns the operation of a control subject ("" when subject is
// not one).
func (n Names) ControlOp(subject string) string {
	op, _ := strings.CutPrefix(subject, n.controlPrefix)
	if op == subject {
		return ""
	}
	return op
}

// AuditSubject is the subject the audit trail of ledger partition p is
// appended on: "idem.audit.3" for partition 3.
func (n Names) AuditSubject(p int) string { return n.auditPrefix + strconv.Itoa(p) }

// AuditSubjects is the subject filter of the audit stream: every
// partition's trail.
func (n Names) AuditSubjects() string { return n.auditPrefix + "*" }

// AuditPartition returns the partition of an audit trail subject (false
// when subject is not one).
func (n Names) AuditPartition(subject string) (int, bool) {
	rest, ok := strings.CutPrefix(subject, n.auditPrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(rest)
	if err != nil || p < 0 || p >= MaxPartitions || strconv.Itoa(p) != rest {
		return 0, false
	}
	return p, true
}
