package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// partitionOps is how many distinct operations the partition test runs.
const partitionOps = 80

// answerSummary is what an operation's answers show, whatever the ledger's
// layout: its status and how many of its copies fired.
type answerSummary struct {
	status intent.Status
	fired  int
	copies int
}

// runPartitioned runs partitionOps operations, each published twice at once
// and the last one again with other arguments under the same key (a
// conflict), on 3 workers over a ledger of the given partitions, and
// returns each key's answers and the JetStream URL.
func runPartitioned(t *testing.T, partitions int) (map[string]answerSummary, string) {
	t.Helper()
	url := jetStream(t)
	hook := newSink(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"sent":true}`)
	})
	tools := writeTools(t, webhookTools(hook.URL, "30s"))
	for i := range 3 {
		startWorker(t, fmt.Sprintf("w%d", i+1), url, tools, "--ledger-partitions", fmt.Sprint(partitions), "--concurrency", "32")
	}
	nc := connect(t, url)
	var mu sync.Mutex
	var all []func(time.Duration) intent.Result
	var wg sync.WaitGroup
	for i := range partitionOps {
		data := fmt.Sprintf(`{"tool":"send_email","args":{"to":"user%d@example.com","subject":"partitions"}}`, i)
		if i == partitionOps-1 {
			data = `{"tool":"send_email","key":"order-1","args":{"to":"a@example.com"}}`
		}
		for range 2 {
			wg.Go(func() {
				w := publishRaw(t, nc, "idem.intents.send_email", []byte(data))
				mu.Lock()
				all = append(all, w)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	got := map[string]answerSummary{}
	for _, wait := range all {
		res := wait(60 * time.Second)
		a := got[res.Key]
		a.copies++
		if !res.Replayed {
			a.fired++
		}
		a.status = res.Status
		got[res.Key] = a
	}
	// The conflict: the override key with other arguments, once the first
	// is answered.
	res := publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","key":"order-1","args":{"to":"b@example.com"}}`))(60 * time.Second)
	require.Equal(t, intent.StatusConflict, res.Status, "%+v", res)
	got[res.Key+" conflict"] = answerSummary{status: res.Status, copies: 1}
	require.Equal(t, partitionOps, hook.count(), "each operation fired once")
	return got, url
}

// Three workers over an 8-partition ledger give every caller the same
// answers as over one partition; each record sits in its key's partition
// (docs/protocol.md 6.1) and nowhere else; operator listing spans the
// partitions; a worker started with another partition count refuses.
func TestPartitionedLedgerAnswersAsOne(t *testing.T) {
	t.Parallel()
	var one, eight map[string]answerSummary
	var url8 string
	var wg sync.WaitGroup
	wg.Go(func() { one, _ = runPartitioned(t, 1) })
	wg.Go(func() { eight, url8 = runPartitioned(t, 8) })
	wg.Wait()
	require.Len(t, one, partitionOps+1)
	require.Equal(t, one, eight, "the same answers on 1 and 8 partitions")

	js, err := jetstream.New(connect(t, url8))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, 8, ledger.Partitions())
	layout := ledger.Layout()
	kvs := make([]jetstream.KeyValue, 8)
	for i := range kvs {
		kvs[i], err = js.KeyValue(ctx, dedup.PartitionBucket("IDEM_LEDGER", i))
		require.NoError(t, err)
	}
	perPart := make([]int, 8)
	for key := range eight {
		if strings.HasSuffix(key, " conflict") {
			continue
		}
		p := intent.Partition(key, 8)
		perPart[p]++
		stored, err := intent.LedgerKey(key, layout)
		require.NoError(t, err)
		for i, kv := range kvs {
			_, err := kv.Get(ctx, stored)
			if i == p {
				require.NoError(t, err, "%s in its partition %d", key, p)
			} else {
				require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "%s not in partition %d", key, i)
			}
		}
	}
	for p, n := range perPart {
		require.Positive(t, n, "partition %d holds records", p)
	}

	s := submit(t, url8, "list", "--all", "--limit", "7")
	require.Equal(t, 0, s.code, s.stderr)
	require.Contains(t, s.stderr, fmt.Sprintf("%d records", partitionOps))
	require.Len(t, lines(s.stdout), partitionOps)

	bad := launchWorker(t, "w-bad", []string{"--tools", writeTools(t, webhookTools("http://127.0.0.1:9", "30s")), "--nats-url", url8, "--ledger-partitions", "4"}, nil)
	select {
	case <-bad.done:
	case <-time.After(30 * time.Second):
		t.Fatal("a worker with another partition count kept running")
	}
	require.Error(t, bad.err)
	require.Contains(t, bad.log.String(), "has 8 partitions")
	require.Contains(t, bad.log.String(), "started with 4")
}
