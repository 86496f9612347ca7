package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// ErrWorkersRunning: MigrateLedger found the work stream's consumer in use —
// intents delivered and not acknowledged, or a worker waiting for more.
var ErrWorkersRunning = errors.New("client: workers are running")

// MigrateLedger grows the ledger's partitions and/or converts its key layout
// (dedup.Migrate), offline. It first checks the workers' consumer on the
// work stream: while it has intents delivered and not acknowledged, or pull
// requests of a worker waiting for intents, it refuses with
// ErrWorkersRunning and changes nothing. Stop every worker first (intents
// published meanwhile wait in the stream), and start them again once it
// returns. Clients may stay up: a Client looks at the ledger's shape again
// when a read misses and while it waits, and reads and waits in the new
// one.
func (c *Client) MigrateLedger(ctx context.Context, cfg dedup.MigrateConfig) (dedup.MigrateReport, error) {
	cons, err := c.js.Consumer(ctx, c.names.Stream, c.names.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		// No worker ever consumed: nothing can be in flight.
	case err != nil:
		return dedup.MigrateReport{}, fmt.Errorf("client: migrate: the workers' consumer %s: %w", c.names.Consumer, err)
	default:
		if info := cons.CachedInfo(); info.NumAckPending > 0 || info.NumWaiting > 0 {
			return dedup.MigrateReport{}, fmt.Errorf("%w: consumer %s has %d intents delivered and not acknowledged and %d pull requests waiting: stop every worker, then migrate",
				ErrWorkersRunning, c.names.Consumer, info.NumAckPending, info.NumWaiting)
		}
	}
	rep, err := dedup.Migrate(ctx, c.js, c.names.Bucket, cfg)
	if err != nil {
		return rep, fmt.Errorf("client: %w", err)
	}
	return rep, nil
}
