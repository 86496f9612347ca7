package jsbackend_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

// TestSyncProbe writes a bucket on a server that syncs always in each of the
// ways JetStream offers for a group of conditional writes, so that the syncs
// each way costs can be counted from outside: run under strace, it opens
// /syncprobe/<way>/begin and /syncprobe/<way>/end (which do not exist)
// around each way, and docs/performance.md says how the counts were taken:
//
//	go test -c -o /tmp/jsbackend.test ./pkg/dedup/internal/jsbackend
//	IDEMGATE_SYNCPROBE=1 strace -f -y -o /tmp/probe.strace \
//	    -e trace=fsync,fdatasync,openat /tmp/jsbackend.test -test.run TestSyncProbe -test.v
//	python3 pkg/dedup/internal/jsbackend/testdata/syncprobe.py /tmp/probe.strace
//
// IDEMGATE_SYNCPROBE_REPLICAS (1 or 3; default 1), _BATCHES (batches per
// way; default 40), _WRITES (writes per batch; default 32) and _AGE (how long
// to wait after the first writes, e.g. 3m: the server writes a stream's
// index.db 2 to 2.5 minutes after it starts, and from then on each R1 commit
// syncs it too; default 0) shape it. Every write is conditional on its key's
// latest revision, as the ledger's are.
func TestSyncProbe(t *testing.T) {
	if os.Getenv("IDEMGATE_SYNCPROBE") == "" {
		t.Skip("set IDEMGATE_SYNCPROBE=1 to run (under strace)")
	}
	replicas := envInt(t, "IDEMGATE_SYNCPROBE_REPLICAS", 1)
	batches := envInt(t, "IDEMGATE_SYNCPROBE_BATCHES", 40)
	writes := envInt(t, "IDEMGATE_SYNCPROBE_WRITES", 32)
	syncAlways := func(o *server.Options) { o.SyncAlways = true }
	var servers []*server.Server
	if replicas == 1 {
		servers = []*server.Server{natstest.RunServer(t, syncAlways)}
	} else {
		servers = natstest.RunCluster(t, replicas, syncAlways)
	}
	ctx := t.Context()
	nc := natstest.Connect(t, servers[0].ClientURL())
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Minute))
	require.NoError(t, err)
	_, err = jsbackend.Ensure(ctx, js, jsbackend.Settings{Name: "probe", Replicas: replicas,
		Storage: jetstream.FileStorage, AtomicPublish: true, MaxConsumers: 10})
	require.NoError(t, err)
	st, err := js.Stream(ctx, "KV_probe")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.AllowBatchPublish = true // fast batches
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	if replicas > 1 {
		// Publish through the stream leader's server, as a client near it
		// would; the others only replicate.
		info, err := st.Info(ctx)
		require.NoError(t, err)
		for _, s := range servers {
			if s.Name() == info.Cluster.Leader {
				nc = natstest.Connect(t, s.ClientURL())
			}
		}
	}
	p := &probe{t: t, nc: nc, revs: map[string]uint64{}}
	p.warm(ctx, js, writes)
	if age := os.Getenv("IDEMGATE_SYNCPROBE_AGE"); age != "" {
		d, err := time.ParseDuration(age)
		require.NoError(t, err)
		time.Sleep(d)
	}

	for _, way := range []struct {
		name string
		run  func(keys []string)
	}{
		{"atomic-1", func(keys []string) { p.atomic(keys) }},
		{"atomic-2", nil}, // two writers, a batch each in flight
		{"atomic-4", nil},
		{"plain-pipelined", func(keys []string) { p.plain(ctx, js, keys) }},
		{"fast", func(keys []string) { p.fast(keys) }},
	} {
		inflight := 1
		run := way.run
		switch way.name {
		case "atomic-2":
			inflight, run = 2, p.atomic
		case "atomic-4":
			inflight, run = 4, p.atomic
		}
		mark(way.name + "/begin")
		start := time.Now()
		var wg sync.WaitGroup
		for w := range inflight {
			keys := make([]string, writes)
			for i := range keys {
				keys[i] = fmt.Sprintf("w%d.k%d", w, i)
			}
			wg.Go(func() {
				for range batches / inflight {
					run(keys)
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		mark(way.name + "/end")
		n := batches / inflight * inflight
		t.Logf("%-16s R%d: %d batches of %d writes in %v: %.2f ms a batch, %.0f writes/s",
			way.name, replicas, n, writes, took.Round(time.Millisecond),
			float64(took.Microseconds())/1000/float64(n), float64(n*writes)/took.Seconds())
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, name)
	return n
}

// mark leaves a line in an strace of this process.
func mark(what string) {
	if f, err := os.Open("/syncprobe/" + what); err == nil {
		_ = f.Close()
	}
}

type probe struct {
	t    *testing.T
	nc   *nats.Conn
	mu   sync.Mutex
	revs map[string]uint64
}

func (p *probe) rev(key string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.revs[key]
}

func (p *probe) setRev(key string, rev uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.revs[key] = rev
}

func (p *probe) msg(key string) *nats.Msg {
	m := nats.NewMsg("$KV.probe." + key)
	m.Data = make([]byte, 300) // about a ledger record
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(p.rev(key), 10))
	return m
}

// warm writes every key once, so that the ways below all update.
func (p *probe) warm(ctx context.Context, js jetstream.JetStream, writes int) {
	var keys []string
	for w := range 4 {
		for i := range writes {
			keys = append(keys, fmt.Sprintf("w%d.k%d", w, i))
		}
	}
	p.plain(ctx, js, keys)
}

// atomic writes keys as one atomic batch, as the ledger does.
func (p *probe) atomic(keys []string) {
	id := nuid.Next()
	for i, key := range keys {
		m := p.msg(key)
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < len(keys)-1 {
			require.NoError(p.t, p.nc.PublishMsg(m))
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		resp, err := p.nc.RequestMsg(m, time.Minute)
		require.NoError(p.t, err)
		var ack struct {
			Error *jetstream.APIError `json:"error"`
			Seq   uint64              `json:"seq"`
			Count int                 `json:"count"`
		}
		require.NoError(p.t, json.Unmarshal(resp.Data, &ack))
		require.Nil(p.t, ack.Error)
		require.Equal(p.t, len(keys), ack.Count)
		for j, k := range keys {
			p.setRev(k, ack.Seq-uint64(len(keys)-1-j))
		}
	}
}

// plain publishes keys one message each, all in flight at once, and waits
// for every acknowledgement.
func (p *probe) plain(ctx context.Context, js jetstream.JetStream, keys []string) {
	futures := make([]jetstream.PubAckFuture, len(keys))
	for i, key := range keys {
		f, err := js.PublishMsgAsync(p.msg(key))
		require.NoError(p.t, err)
		futures[i] = f
	}
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			p.setRev(keys[i], ack.Sequence)
		case err := <-f.Err():
			require.NoError(p.t, err)
		case <-ctx.Done():
			p.t.Fatal(ctx.Err())
		}
	}
}

// fast writes keys as a fast batch (gap mode "fail", a flow acknowledgement
// asked every len(keys) messages) and waits for the commit's
// acknowledgement.
func (p *probe) fast(keys []string) {
	id := nuid.Next()
	prefix := "_PROBE_FI." + id
	sub, err := p.nc.SubscribeSync(prefix + ".>")
	require.NoError(p.t, err)
	defer func() { _ = sub.Unsubscribe() }()
	for i, key := range keys {
		op := 1 // append
		switch {
		case i == 0:
			op = 0 // start
		case i == len(keys)-1:
			op = 2 // commit
		}
		m := p.msg(key)
		m.Reply = fmt.Sprintf("%s.%d.fail.%d.%d.$FI", prefix, len(keys), i+1, op)
		require.NoError(p.t, p.nc.PublishMsg(m))
	}
	for {
		resp, err := sub.NextMsg(time.Minute)
		require.NoError(p.t, err)
		var r struct {
			Type   string              `json:"type"`
			Stream string              `json:"stream"`
			Seq    uint64              `json:"seq"`
			Count  int                 `json:"count"`
			Error  *jetstream.APIError `json:"error"`
		}
		require.NoError(p.t, json.Unmarshal(resp.Data, &r), string(resp.Data))
		require.Nil(p.t, r.Error, string(resp.Data))
		if r.Stream == "" {
			continue // flow control
		}
		require.Equal(p.t, len(keys), r.Count, string(resp.Data))
		for j, k := range keys {
			p.setRev(k, r.Seq-uint64(len(keys)-1-j))
		}
		return
	}
}
