package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// ErrBadReceipt: a client given the workers' public keys (WithReceiptKeys)
// got an answer whose receipt is missing or does not verify. The answer is
// returned with it; see docs/audit.md.
var ErrBadReceipt = errors.New("client: bad receipt")

// WithReceiptKeys makes the client verify the receipt of every answer that
// carries one (completed, failed, denied, already_done; a conflict a
// worker answered) with keys: its signature, and that it records that
// answer's operation, run and outcome (audit.VerifyReceipt), the answer's
// text read as written (audit.CheckAnswerText), and, for a submission's
// answer that is not a replay, that one of its own publishes started the
// run (its intent_seq). An answer whose receipt is missing or
// does not verify is returned with an error matching ErrBadReceipt.
// Default: receipts are passed on unchecked (Result.Receipt).
func WithReceiptKeys(keys *audit.KeySet) Option { return func(o *options) { o.receiptKeys = keys } }

// checkReceipt verifies res's receipt when the client has keys; an answer
// without one passes when its status carries none, or it is a conflict the
// client found in the ledger itself (no worker answered it).
func (c *Client) checkReceipt(res *intent.Result) error {
	if !c.checksReceipt(res) {
		return nil
	}
	if _, err := audit.VerifyReceipt(*res, c.receiptKeys); err != nil {
		return fmt.Errorf("%w: %w", ErrBadReceipt, err)
	}
	return nil
}

// checksReceipt reports whether the client checks res's receipt: it has
// keys, and res is an answer that carries one.
func (c *Client) checksReceipt(res *intent.Result) bool {
	if c.receiptKeys == nil || res == nil || !audit.Receipted(res.Status) {
		return false
	}
	return res.Status != intent.StatusConflict || len(res.Receipt) > 0
}

// PublishedKeys returns the public keys the workers sign the audit trail
// and receipts with, as they published them (audit.PublishedKeys). An
// auditor who must not trust the installation uses a keys file of its own.
func (c *Client) PublishedKeys(ctx context.Context) (*audit.KeySet, error) {
	ks, err := audit.PublishedKeys(ctx, c.js, c.names)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return ks, nil
}

// ReadAudit calls line with every line of the audit trail f selects (see
// audit.Read): the JSON lines an auditor verifies.
func (c *Client) ReadAudit(ctx context.Context, f audit.Filter, line func([]byte) error) error {
	if err := audit.Read(ctx, c.js, c.names, f, line); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}

// History returns the audit trail's entries about key, oldest first (see
// audit.History), appended since since; a zero since reads from an hour
// before the key's record was created, or — when it has none (forgotten,
// or expired) — the whole trail of its partition.
func (c *Client) History(ctx context.Context, key string, since time.Time) ([][]byte, error) {
	parts, since, err := c.historyRange(ctx, key, since)
	if err != nil {
		return nil, err
	}
	lines, err := audit.History(ctx, c.js, c.names, parts, key, since)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return lines, nil
}

// CheckedHistory reads the history of key as History does, and checks
// each entry's signature and link in its partition's chain with keys
// (audit.CheckedHistory); the gaps of the partition read come with it.
func (c *Client) CheckedHistory(ctx context.Context, key string, since time.Time, keys *audit.KeySet) ([]audit.Checked, error) {
	parts, since, err := c.historyRange(ctx, key, since)
	if err != nil {
		return nil, err
	}
	out, err := audit.CheckedHistory(ctx, c.js, c.names, parts, key, since, keys)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return out, nil
}

// historyRange is the ledger's partitions and where the history of key
// starts: since, or an hour before its record's creation.
func (c *Client) historyRange(ctx context.Context, key string, since time.Time) (int, time.Time, error) {
	if key == "" {
		return 0, since, fmt.Errorf("client: %w: history: no key", intent.ErrInvalid)
	}
	parts, err := dedup.RecordedPartitions(ctx, c.js, c.names.Bucket)
	if err != nil {
		return 0, since, fmt.Errorf("client: ledger bucket %s: %w", c.names.Bucket, err)
	}
	if since.IsZero() {
		if rec, err := c.Get(ctx, key); err == nil {
			since = rec.CreatedAt.Add(-time.Hour)
		}
	}
	return parts, since, nil
}

// WatchAudit sends the events of every append written to the audit trail
// after the call, pushed by the server (see audit.Watch): that an
// operation's history grew, unchecked. The channel is closed when ctx ends
// or the watch fails.
func (c *Client) WatchAudit(ctx context.Context) (<-chan audit.Event, error) {
	ch, err := audit.Watch(ctx, c.js, c.names)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return ch, nil
}

// Checkpoints returns signed checkpoints of every partition of the audit
// trail (audit.Checkpoint): fresh ones a worker makes on request, or —
// when no worker answers within a few seconds — the latest ones the workers
// stored (fresh is false then).
func (c *Client) Checkpoints(ctx context.Context) (cps []audit.Checkpoint, fresh bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cps, err = audit.RequestCheckpoints(rctx, c.nc, c.names)
	cancel()
	if err == nil {
		return cps, true, nil
	}
	if ctx.Err() != nil {
		return nil, false, fmt.Errorf("client: %w", ctx.Err())
	}
	cps, err = audit.LatestCheckpoints(ctx, c.js, c.names)
	if err != nil {
		return nil, false, fmt.Errorf("client: %w", err)
	}
	return cps, false, nil
}

// StoredCheckpoints returns the latest checkpoints the workers stored,
// without asking for fresh ones (audit.LatestCheckpoints).
func (c *Client) StoredCheckpoints(ctx context.Context) ([]audit.Checkpoint, error) {
	cps, err := audit.LatestCheckpoints(ctx, c.js, c.names)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return cps, nil
}
