package jsbackend

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Elect creates key with data and ttl as its per-message TTL, as kv.Create
// does (a delete marker is written over): won false, and no error, when the
// key has a message already.
func (b *Bucket) Elect(ctx context.Context, key string, data []byte, ttl time.Duration) (won bool, err error) {
	_, err = b.kv.Create(ctx, key, data, jetstream.KeyTTL(ttl))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, err
}

// Status asks the server for the bucket's status (its stream's info) and
// returns its error, if any.
func (b *Bucket) Status(ctx context.Context) error {
	_, err := b.kv.Status(ctx)
	return err
}
