package client

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// WatchFinal waits until key's record has a final status (completed, failed,
// denied: see intent.Status.Final) and returns it, past awaiting_approval
// and uncertain. A key with no record yet is waited for too. It returns an
// error wrapping ErrNoAnswer when ctx ends first.
func (c *Client) WatchFinal(ctx context.Context, key string) (dedup.Record, error) {
	w, err := c.watch(ctx, key)
	if err != nil {
		return dedup.Record{}, err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return dedup.Record{}, fmt.Errorf("%w for %s: watch closed", ErrNoAnswer, key)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if rec, err := decodeRecord(e.Value()); err == nil && rec.Status.Final() {
				return rec, nil
			}
		case <-ctx.Done():
			return dedup.Record{}, fmt.Errorf("%w for %s: %w", ErrNoAnswer, key, ctx.Err())
		}
	}
}
