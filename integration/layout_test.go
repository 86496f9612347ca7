package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// storedKey is key's KV key in the ledger IDEM_LEDGER of js, in the layout
// the ledger records.
func storedKey(t *testing.T, js jetstream.JetStream, key string) string {
	t.Helper()
	sk, err := intent.LedgerKey(key, recordedLayout(t, js))
	require.NoError(t, err)
	return sk
}

// recordedLayout is the key layout the ledger IDEM_LEDGER of js records.
func recordedLayout(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"}, dedup.Bind())
	require.NoError(t, err)
	return l.Layout()
}

// A new ledger stores compact keys (layout 2): the raw bucket holds the
// operation under <tool>.<22 base64url>, not under its key, and the record
// as layout 1 stores it. With the worker gone (the test answers the tool
// catalogue with the worker's own answer, so the clients can derive keys),
// a duplicate is answered only from the ledger — a republished copy would
// reach no worker: the Go submit and the TypeScript client both get the
// replay, and both read the record by its key and by the stored key a
// listing shows. A worker started with layout 1 on it refuses to start,
// and a layout the clients do not know is refused by both, by name.
func TestCompactLedgerAnswersDuplicates(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	worker := startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))
	args := `{"to":"ada@example.com","subject":"Compact keys","body":"Hi"}`
	first := submit(t, url, "--tool", "send_email", "--session", "run-9", "--args", args, "--wait", "30s")
	require.Equal(t, 0, first.code, "fired: %s %s", first.stdout, first.stderr)
	key := first.res.Key
	require.True(t, intent.ValidKey(key), key)

	nc := connect(t, url)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.Equal(t, intent.LayoutCompact, recordedLayout(t, js), "a new ledger records layout 2")
	stored := storedKey(t, js, key)
	require.Equal(t, key[:len("send_email.")], stored[:len("send_email.")])
	require.Len(t, stored, len("send_email.")+22)
	kv, err := js.KeyValue(ctx, "IDEM_LEDGER")
	require.NoError(t, err)
	keys, err := kv.Keys(ctx)
	require.NoError(t, err)
	require.Contains(t, keys, stored, "the bucket holds the compact key")
	require.NotContains(t, keys, key, "and not the key itself")
	e, err := kv.Get(ctx, stored)
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	require.Equal(t, "completed", rec["status"])
	require.NotContains(t, rec, "key", "the record is stored as in layout 1")

	// A worker started with another layout than the ledger's refuses to start.
	other := launchWorker(t, "w2", []string{"--tools", writeTools(t, tsTools(hook.URL)), "--holder", "w2", "--nats-url", url,
		"--ledger-layout", "1"}, nil)
	select {
	case <-other.done:
	case <-time.After(30 * time.Second):
		t.Fatal("a worker started with --ledger-layout 1 on a layout-2 ledger did not exit")
	}
	require.Error(t, other.err)
	require.Contains(t, other.log.String(), "has key layout 2")
	require.Contains(t, other.log.String(), "started with 1")

	// The worker's catalogue, served by the test once the worker is gone.
	catalog, err := nc.Request("idem.tools", nil, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, worker.terminate(30*time.Second))
	sub, err := nc.Subscribe("idem.tools", func(m *nats.Msg) { _ = m.Respond(catalog.Data) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	goDup := submit(t, url, "--tool", "send_email", "--session", "run-9", "--args", args, "--wait", "20s")
	require.Equal(t, 3, goDup.code, "Go: a replay, from the ledger: %s %s", goDup.stdout, goDup.stderr)
	require.True(t, goDup.res.Replayed)
	require.Equal(t, key, goDup.res.Key)
	require.JSONEq(t, string(first.res.Result), string(goDup.res.Result))

	tsDup := tsSubmit(t, dir, url, "--tool", "send_email", "--session", "run-9", "--args", args, "--wait", "20000")
	require.Equal(t, 3, tsDup.code, "TypeScript: a replay, from the ledger: %s %s", tsDup.stdout, tsDup.stderr)
	require.True(t, tsDup.res.Replayed)
	require.Equal(t, key, tsDup.res.Key)
	require.JSONEq(t, string(first.res.Result), string(tsDup.res.Result))

	goGet := submit(t, url, "get", key)
	require.Equal(t, 0, goGet.code, "submit get: %s %s", goGet.stdout, goGet.stderr)
	require.Contains(t, goGet.stdout, `"completed"`)
	tsGet := tsRun(t, dir, "get", "--servers", url, key)
	require.Equal(t, 0, tsGet.code, "cli.js get: %s %s", tsGet.stdout, tsGet.stderr)
	require.Contains(t, tsGet.stdout, `"completed"`)
	tsWatch := tsRun(t, dir, "watch", "--servers", url, key, "--wait", "20s")
	require.Equal(t, 0, tsWatch.code, "cli.js watch: %s %s", tsWatch.stdout, tsWatch.stderr)

	list := submit(t, url, "list")
	require.Equal(t, 0, list.code, "submit list: %s %s", list.stdout, list.stderr)
	require.Contains(t, list.stdout, stored, "a listing shows the stored key")
	require.False(t, strings.Contains(list.stdout, "_scan"), "not the ledger's internal keys")
	byStored := submit(t, url, "get", stored)
	require.Equal(t, 0, byStored.code, "submit get of the stored key: %s %s", byStored.stdout, byStored.stderr)
	require.Contains(t, byStored.stdout, `"completed"`)
	tsByStored := tsRun(t, dir, "get", "--servers", url, stored)
	require.Equal(t, 0, tsByStored.code, "cli.js get of the stored key: %s %s", tsByStored.stdout, tsByStored.stderr)

	require.Equal(t, 1, hook.count(), "fired once")

	// A layout neither client knows: both say so, naming it.
	st, err := js.Stream(ctx, "KV_IDEM_LEDGER")
	require.NoError(t, err)
	sc := st.CachedInfo().Config
	sc.Metadata["idemgate.layout"] = "9"
	_, err = js.UpdateStream(ctx, sc)
	require.NoError(t, err)
	goUnknown := submit(t, url, "get", key)
	require.Equal(t, 1, goUnknown.code, goUnknown.stdout)
	require.Contains(t, goUnknown.stderr, `key layout "9"`)
	tsUnknown := tsRun(t, dir, "get", "--servers", url, key)
	require.Equal(t, 1, tsUnknown.code, tsUnknown.stdout)
	require.Contains(t, tsUnknown.stderr, `key layout "9"`)
}
