package integration

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// submit migrate, black-box: refused while a worker consumes; with the
// worker stopped it grows a 2-partition layout-1 ledger to 4 partitions of
// compact keys, counting every record; a worker started again without flags
// runs on the new shape, and the operations done before are replayed, not
// fired again. Run again, it moves nothing.
func TestSubmitMigrate(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	tools := writeTools(t, tsTools(hook.URL))
	worker := startWorker(t, "w1", url, tools, "--ledger-partitions", "2", "--ledger-layout", "1")
	var keys []string
	for i := range 6 {
		args := fmt.Sprintf(`{"to":"u%d@example.com","subject":"Migrate"}`, i)
		s := submit(t, url, "--tool", "send_email", "--args", args, "--wait", "30s")
		require.Equal(t, 0, s.code, "%s %s", s.stdout, s.stderr)
		keys = append(keys, s.res.Key)
	}

	busy := submit(t, url, "migrate", "--partitions", "4", "--layout", "2")
	require.Equal(t, 6, busy.code, "refused while a worker consumes: %s %s", busy.stdout, busy.stderr)
	require.Contains(t, busy.stderr, "stop every worker")

	require.NoError(t, worker.terminate(30*time.Second))
	done := submit(t, url, "migrate", "--partitions", "4", "--layout", "2")
	require.Equal(t, 0, done.code, "%s %s", done.stdout, done.stderr)
	var rep struct {
		From, To       struct{ Partitions, Layout int }
		Records, Moved int
	}
	require.NoError(t, json.Unmarshal([]byte(done.stdout), &rep), done.stdout)
	require.Equal(t, 2, rep.From.Partitions)
	require.Equal(t, 1, rep.From.Layout)
	require.Equal(t, 4, rep.To.Partitions)
	require.Equal(t, 2, rep.To.Layout)
	require.Equal(t, len(keys), rep.Records, "every record counted")
	require.Equal(t, len(keys), rep.Moved, "every KV key changed")

	startWorker(t, "w2", url, tools)
	for i, key := range keys {
		args := fmt.Sprintf(`{"to":"u%d@example.com","subject":"Migrate"}`, i)
		s := submit(t, url, "--tool", "send_email", "--args", args, "--wait", "30s")
		require.Equal(t, 3, s.code, "replayed after the migration: %s %s", s.stdout, s.stderr)
		require.Equal(t, key, s.res.Key)
	}
	require.Equal(t, len(keys), hook.count(), "nothing fired twice")

	// The worker runs again: a second run is refused; stopped, it would
	// move nothing (the dedup tests show it).
	again := submit(t, url, "migrate", "--partitions", "4", "--layout", "2")
	require.Equal(t, 6, again.code, "%s %s", again.stdout, again.stderr)
}
