package worker

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// What handling an intent asks of the outside, declared here so that the
// stages run in unit tests without a JetStream server (stages_test.go's
// fakes keep the same contracts).

// ledger is what the stages ask of the ledger: a *dedup.Ledger (as
// dedupLedger). Its contract: a claim creates a key's record only when the
// key has none, every write is a compare-and-set on the revision it was
// made on, and an expired lease is taken over only at the revision the
// claimant confirmed abandoned (dedup.WithConfirmedTakeover).
type ledger interface {
	// Claim is dedup.Ledger.Claim, its lease the worker's lease.
	Claim(ctx context.Context, req dedup.ClaimRequest) (claim, error)
	// Wait waits for a key's holder (dedup.Ledger.Wait).
	Wait(ctx context.Context, key string) (dedup.Record, uint64, error)
	// WaitChange confirms an expired lease abandoned (dedup.Ledger.WaitChange).
	WaitChange(ctx context.Context, key string, rev uint64) (bool, error)

	// The operator's decisions (control.go), as dedup.Ledger has them.
	Get(ctx context.Context, key string) (dedup.Record, uint64, error)
	Approve(ctx context.Context, key, fingerprint, by, reason string, ttl time.Duration) (dedup.Record, uint64, error)
	Deny(ctx context.Context, key, by, reason string) (dedup.Record, uint64, error)
	Resolve(ctx context.Context, key string, succeeded bool, result json.RawMessage, by, reason string) (dedup.Record, uint64, error)
	// ProbeUncertain records a probe of an uncertain operation (probe.go).
	ProbeUncertain(ctx context.Context, key string, p dedup.Probe, result json.RawMessage) (dedup.Record, uint64, error)
}

// lease is a claimant's hold on one key (a *dedup.Lease): every write is a
// compare-and-set on the lease's revision and fails with dedup.ErrLeaseLost
// once another claimant took the key over.
type lease interface {
	Record() dedup.Record
	Extend(ctx context.Context, d time.Duration) error
	Complete(ctx context.Context, result json.RawMessage, attempts int) (dedup.Record, error)
	Fail(ctx context.Context, e intent.Error, attempts int) (dedup.Record, error)
	Release(ctx context.Context, attempts int) error
	AwaitApproval(ctx context.Context, envelope json.RawMessage) (dedup.Record, error)
	Hold(ctx context.Context, reason string) (dedup.Record, error)
	NoteProbe(ctx context.Context, p dedup.Probe) error
	SettleProbed(ctx context.Context, p dedup.Probe, result json.RawMessage) (dedup.Record, error)
}

// claim is what a claim found and did; its Lease (for dedup.Acquired and
// dedup.TookOver) is the worker's lease, not dedup.ClaimResult's.
type claim struct {
	dedup.ClaimResult
	Lease lease
}

// dedupLedger is a *dedup.Ledger as the stages' ledger.
type dedupLedger struct{ *dedup.Ledger }

func (l dedupLedger) Claim(ctx context.Context, req dedup.ClaimRequest) (claim, error) {
	c, err := l.Ledger.Claim(ctx, req)
	if c.Lease == nil {
		return claim{ClaimResult: c}, err
	}
	return claim{ClaimResult: c, Lease: c.Lease}, err
}

// message is what the stages ask of an intent's message (a jetstream.Msg):
// what it carries, and the verbs that settle it (verdict.go) or keep it
// (heartbeat.go).
type message interface {
	Subject() string
	Headers() nats.Header
	Data() []byte
	Metadata() (*jetstream.MsgMetadata, error)
	InProgress() error
	Ack() error
	NakWithDelay(delay time.Duration) error
	TermWithReason(reason string) error
}

// publisher publishes an answer on core NATS (a *nats.Conn).
type publisher interface {
	PublishMsg(m *nats.Msg) error
}

// streamPublisher publishes a dead letter and waits for the stream's
// acknowledgement (a jetstream.JetStream).
type streamPublisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}
