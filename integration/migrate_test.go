package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
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

// A front door that stays up across a migration (2 partitions of full keys
// to 4 of compact keys) reads and waits in the new shape: a record it read
// before is found in its new place, a wait on the ledger begun before the
// migration for an operation that fires after it is answered, and a repeat
// of an earlier call is answered from the ledger as a replay. A TypeScript
// watch begun before the migration is answered too.
func TestGatewayFollowsAMigration(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	tools := writeTools(t, tsTools(hook.URL))
	worker := startWorker(t, "w1", url, tools, "--ledger-partitions", "2", "--ledger-layout", "1")
	gw := startGateway(t, url)

	first := `{"to":"u1@example.com","subject":"Migrate"}`
	done := gw.call(t, agentA, "send_email", first)
	require.Equal(t, http.StatusOK, done.status, done.raw)
	doneKey := done.answer(t).Key
	read := gw.do(t, http.MethodGet, "/v1/operations/"+doneKey, agentA, "")
	require.Equal(t, http.StatusOK, read.status, "read in the first shape: %s", read.raw)

	// With the workers stopped, an operation waits in the stream, and a
	// caller waits for its record through the front door.
	require.NoError(t, worker.terminate(30*time.Second))
	queued := gw.call(t, agentA, "send_email", `{"to":"u2@example.com","subject":"Migrate"}`, "Prefer", "wait=1")
	requireProblem(t, queued, http.StatusConflict, "in_flight")
	queuedKey := queued.str("key")
	require.NotEmpty(t, queuedKey, queued.raw)
	partition := dedup.PartitionBucket("IDEM_LEDGER", intent.Partition(queuedKey, 2))
	stored, err := intent.LedgerKey(queuedKey, 1)
	require.NoError(t, err)
	watchers := func() int { return subscriptions(t, url, "$KV."+partition+"."+stored) }
	before := watchers()
	waited := make(chan response, 1)
	go func() { waited <- getAsync(gw, "/v1/operations/"+queuedKey+"?wait=50", gw.tokens[agentA]) }()
	tsWatched := make(chan submitted, 1)
	go func() { tsWatched <- tsRunRaw(t, dir, "watch", queuedKey, "--servers", url, "--wait", "50s") }()
	require.Eventually(t, func() bool { return watchers() >= before+2 }, time.Minute, 20*time.Millisecond,
		"the front door and the TypeScript client watch the key in its first shape")

	migrated := submit(t, url, "migrate", "--partitions", "4", "--layout", "2")
	require.Equal(t, 0, migrated.code, "%s %s", migrated.stdout, migrated.stderr)

	again := gw.do(t, http.MethodGet, "/v1/operations/"+doneKey, agentA, "")
	require.Equal(t, http.StatusOK, again.status, "found in its new place: %s", again.raw)
	require.Equal(t, string(intent.StatusCompleted), again.str("status"))

	startWorker(t, "w2", url, tools)
	w := <-waited
	require.Equal(t, http.StatusOK, w.status, "the wait begun before the migration is answered: %s", w.raw)
	require.Equal(t, string(intent.StatusCompleted), w.str("status"), w.raw)
	ts := <-tsWatched
	require.Equal(t, 0, ts.code, "the TypeScript watch is answered: %s %s", ts.stdout, ts.stderr)

	replay := gw.call(t, agentA, "send_email", first, "Prefer", "wait=50")
	require.Equal(t, http.StatusOK, replay.status, replay.raw)
	require.True(t, replay.answer(t).Replayed, replay.raw)
	require.Equal(t, 2, hook.count(), "each operation fired once")
}

// getAsync GETs path from the front door as the holder of token, for a
// goroutine: failures are in the response (status 0, the error as raw).
func getAsync(g *gateway, path, token string) response {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url+path, nil)
	if err != nil {
		return response{raw: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{raw: err.Error()}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, header: resp.Header, raw: string(data)}
	_ = json.Unmarshal(data, &r.body)
	return r
}
