package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// TestLedgerSizeShort fills a ledger on a nats-server process to a few
// thousand keys in two steps and checks each row has positive per-key
// figures, and that -layout picks how the keys are stored. It asserts no
// size: the scenario prints figures.
func TestLedgerSizeShort(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	server := natsServerBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := ledgerSizeConfig{Server: server, Keys: 2000, Step: 1000, Concurrency: 32, Samples: 50, Partitions: 2, Layout: intent.LayoutFull,
		ResultBytes: 48, TTL: time.Hour, StoreDir: t.TempDir()}
	require.NoError(t, c.validate())
	bad := c
	bad.Layout = 3
	require.ErrorContains(t, bad.validate(), "-layout 3")
	var buf bytes.Buffer
	rows, err := runLedgerSize(ctx, c, &buf)
	t.Log("\n" + buf.String())
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for _, r := range rows {
		for _, f := range []float64{r.rate, r.heapKey, r.rssKey, r.diskKey, r.getP99.Seconds(), r.dupP99.Seconds()} {
			require.Truef(t, finitePositive(f), "row at %d keys: figure %v", r.keys, f)
		}
	}
	require.Equal(t, 2000, rows[1].keys)
	require.Contains(t, buf.String(), "75-byte key stored as a 75-byte KV key (layout 1)", "the fill's keys go through the ledger's layout, as -layout asks")
}

// natsServer is the nats-server binary the ledger scenarios' tests share,
// built once per run.
var natsServer struct {
	once sync.Once
	dir  string
	err  error
}

// natsServerBinary returns the path of a nats-server built from the pinned
// module.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	natsServer.once.Do(func() {
		if natsServer.dir, natsServer.err = os.MkdirTemp("", "bench-nats-server-"); natsServer.err != nil {
			return
		}
		build := exec.Command("go", "build", "-o", filepath.Join(natsServer.dir, "nats-server"), "github.com/nats-io/nats-server/v2")
		if out, err := build.CombinedOutput(); err != nil {
			natsServer.err = fmt.Errorf("build nats-server: %w\n%s", err, out)
		}
	})
	require.NoError(t, natsServer.err)
	return filepath.Join(natsServer.dir, "nats-server")
}
