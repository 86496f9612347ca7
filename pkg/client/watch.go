package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// WatchRecords sends every write made to the ledger after the call — each
// record written or deleted, in every partition — on the returned channel,
// pushed by the server (see dedup.Ledger.WatchAll). The channel is closed
// when ctx ends or the connection closes. A console that shows operations
// live reads it; it sees every tool's and every session's records, so a
// front door filters them by the caller's namespace.
func (c *Client) WatchRecords(ctx context.Context) (<-chan dedup.Change, error) {
	r, err := c.reader(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := r.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return ch, nil
}

// GetRevision reads key's ledger record and its revision (from the stream
// leader), as Get does; the revision orders it against the changes
// WatchRecords sends. It returns ErrNotFound when there is none.
func (c *Client) GetRevision(ctx context.Context, key string) (dedup.Record, uint64, error) {
	r, err := c.reader(ctx)
	if err != nil {
		return dedup.Record{}, 0, err
	}
	rec, rev, err := r.Get(ctx, key)
	if errors.Is(err, dedup.ErrNotFound) {
		return rec, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return rec, rev, err
}
