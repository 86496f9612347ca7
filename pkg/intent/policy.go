package intent

// The values of a tool's policy, as the tools file declares them and the
// tool catalogue (ToolInfo) reports them. The workers' typed policy
// (effects.Policy) is made of these.

// Class says what repeating a tool's call does to the world.
type Class string

// Tool classes.
const (
	// ClassRead: reads change nothing. They never touch the ledger: each
	// intent fires directly, and identical reads in flight on one worker are
	// coalesced into one call.
	ClassRead Class = "read"
	// ClassIdempotent: absolute writes (set a value, PUT, delete by id) whose
	// repeat leaves the same state. The ledger is optional (on by default:
	// callers then get the recorded answer and the downstream is spared).
	ClassIdempotent Class = "idempotent"
	// ClassUnsafe: creates, sends, charges, increments. The ledger is
	// required, and an intent whose key cannot be derived (a key arg missing
	// and no explicit key) is refused. The default class.
	ClassUnsafe Class = "unsafe"
)

// Abandon is what happens to a key whose holder vanished mid-effect (its
// lease expired without an outcome).
type Abandon string

// Abandoned-lease policies.
const (
	// AbandonRetry: the next claimant takes the key over and fires again with
	// the same key (a keyed downstream absorbs the repeat). The default.
	AbandonRetry Abandon = "retry"
	// AbandonHold: the record moves to uncertain and is never fired again on
	// its own; an operator settles it (submit resolve).
	AbandonHold Abandon = "hold"
)

// Approval says whether each operation of a tool waits for an approval,
// bound to its key and fingerprint, before it fires.
type Approval string

// Approval policies.
const (
	// ApprovalNone: operations fire without approval. The tools file's
	// default; the catalogue leaves the field out.
	ApprovalNone Approval = "none"
	// ApprovalRequired: each operation waits for an approval.
	ApprovalRequired Approval = "required"
)

// Approver is who approves the operations of a tool that requires approval.
type Approver string

// Approvers.
const (
	// ApproverOperator: an operator approves (submit approve, the HTTP
	// operator API). The default.
	ApproverOperator Approver = "operator"
	// ApproverUser: the person at the agent's client approves; a client
	// that can ask them (MCP elicitation) does, and the decision goes
	// through the same path as an operator's.
	ApproverUser Approver = "user"
)

// OnFailure is what a later call of an operation that failed (permanently)
// does.
type OnFailure string

// Re-run policies for a failed operation.
const (
	// OnFailureReplay: the failure is the answer; a later call is answered
	// with it and fires nothing. The default.
	OnFailureReplay OnFailure = "replay"
	// OnFailureRetry: a later call with the same key (and arguments) runs
	// the operation again; the failure is never replayed.
	OnFailureRetry OnFailure = "retry"
)

// OnComplete is what a later call of an operation that completed does.
type OnComplete string

// Re-run policies for a completed operation.
const (
	// OnCompleteReplay: a later call is answered with the recorded result,
	// marked replayed. The default.
	OnCompleteReplay OnComplete = "replay"
	// OnCompleteReject: a later call is answered already_done, carrying
	// what ran, for tools where a repeat means the agent is confused.
	OnCompleteReject OnComplete = "reject"
)
