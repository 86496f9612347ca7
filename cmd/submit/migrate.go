package main

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// cmdMigrate grows the ledger's partitions and/or converts it to compact
// keys, offline (client.MigrateLedger), and prints what it did.
func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit migrate", "submit migrate [--partitions N] [--layout 2] [flags]: with every worker stopped", args, stdout, stderr)
	var c common
	c.register(fs)
	partitions := fs.Int("partitions", 0, "the new partition count: a power of two, at least the ledger's (0: keep it)")
	layout := fs.Int("layout", 0, "the new key layout: 2 converts a ledger of layout 1 to compact keys (0: keep it)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long (run it again to finish)")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 0 {
		return exitError, errors.New("usage: submit migrate [--partitions N] [--layout 2]")
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := cl.MigrateLedger(ctx, dedup.MigrateConfig{Partitions: *partitions, Layout: *layout})
	switch {
	case errors.Is(err, client.ErrWorkersRunning), errors.Is(err, dedup.ErrInFlight):
		return exitOpen, err
	case err != nil:
		return exitError, err
	}
	return exitFired, printJSON(stdout, map[string]any{
		"from":    map[string]int{"partitions": rep.FromPartitions, "layout": rep.FromLayout},
		"to":      map[string]int{"partitions": rep.ToPartitions, "layout": rep.ToLayout},
		"records": rep.Records, "moved": rep.Moved, "resumed": rep.Resumed,
	})
}
