package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// natsServerProc is a nats-server process on a store of its own, which the
// test can SIGKILL and start again on the same store and port.
type natsServerProc struct {
	bin, conf, store, url string
	p                     *proc
}

// startNatsServer builds nats-server from the pinned module and starts it
// with sync_interval always (every synced write is on disk before its
// acknowledgement), on a fresh store.
func startNatsServer(t *testing.T) *natsServerProc {
	t.Helper()
	dir := t.TempDir()
	s := &natsServerProc{bin: filepath.Join(dir, "nats-server"), conf: filepath.Join(dir, "nats.conf"), store: filepath.Join(dir, "store")}
	build := exec.Command("go", "build", "-o", s.bin, "github.com/nats-io/nats-server/v2")
	build.Dir = ".."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build nats-server: %s", out)
	port := freePort(t)
	s.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	conf := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", port, s.store)
	require.NoError(t, os.WriteFile(s.conf, []byte(conf), 0o644))
	s.start(t)
	return s
}

// start runs the server and waits until it serves JetStream.
func (s *natsServerProc) start(t *testing.T) {
	t.Helper()
	s.p = &proc{t: t, name: "nats-server", cmd: exec.Command(s.bin, "-c", s.conf), log: &syncBuffer{}, done: make(chan struct{})}
	s.p.cmd.Stdout, s.p.cmd.Stderr = s.p.log, s.p.log
	require.NoError(t, s.p.cmd.Start())
	p := s.p
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", p.log.String())
		}
	})
	until(t, "nats-server serves JetStream", func() bool {
		nc, err := nats.Connect(s.url)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})
}

// lastBlock is the path of the newest message block of stream on the store
// and its size (0 when the stream has none yet).
func (s *natsServerProc) lastBlock(t *testing.T, stream string) (string, int64) {
	t.Helper()
	blocks, err := filepath.Glob(filepath.Join(s.store, "jetstream", "$G", "streams", stream, "msgs", "*.blk"))
	require.NoError(t, err)
	if len(blocks) == 0 {
		return filepath.Join(s.store, "jetstream", "$G", "streams", stream, "msgs", "1.blk"), 0
	}
	slices.SortFunc(blocks, func(a, b string) int { return len(a) - len(b) }) // 9.blk before 10.blk
	last := blocks[len(blocks)-1]
	fi, err := os.Stat(last)
	require.NoError(t, err)
	return last, fi.Size()
}

// An intent the server acknowledged and then lost — the default work
// stream persists asynchronously, so the server writes an intent after
// acknowledging it and syncs it later — must still fire exactly once and be
// answered. A real nats-server process (sync_interval always) is SIGKILLed
// after the client's publish was acknowledged and before any worker
// consumed it. A SIGKILL loses only what the server had not yet written
// (milliseconds), and the page cache keeps what it wrote, so the test
// simulates the power loss that follows: with the server dead it truncates
// the work stream's last message block to its size before the publish,
// the bytes written since the stream's last sync, then restarts the server
// on that store. The client (pkg/client, the Go front doors' client) finds
// no record after its reply grace and publishes the intent again under a
// fresh message id; the worker started afterwards fires it once and the
// client gets the completed answer as its own. The TypeScript client alike.
func TestIntentLostInServerCrashIsRepublishedAndFiresOnce(t *testing.T) {
	skipShort(t, "a nats-server process killed and restarted")
	t.Parallel()
	srv := startNatsServer(t)
	hook := newSink(t, nil)
	tools := writeTools(t, fmt.Sprintf("tools:\n  send_email:\n    effect: webhook\n    key_args: [to]\n    lease: 5s\n    webhook: {url: %s/email, timeout: 10s}\n", hook.URL))

	// A worker creates the streams with the defaults, then stops: nothing
	// consumes while the intent is published and lost.
	w1 := startWorker(t, "w1", srv.url, tools)
	require.NoError(t, w1.terminate(30*time.Second))
	names, err := intent.NewNames("")
	require.NoError(t, err)
	nc, err := nats.Connect(srv.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), names.Stream)
	require.NoError(t, err)
	require.Equal(t, jetstream.AsyncPersistMode, st.CachedInfo().Config.PersistMode, "the default work stream persists asynchronously")

	block, before := srv.lastBlock(t, names.Stream)
	// The TypeScript client first: once it watches the ledger key (it reads
	// the key from the stream leader, a request this connection sees too),
	// its publish was acknowledged.
	reads, err := nc.SubscribeSync("$JS.API.STREAM.MSG.GET.KV_" + names.Bucket)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	tsDir := tsClient(t)
	tsDone := make(chan submitted, 1)
	go func() {
		tsDone <- tsSubmit(t, tsDir, srv.url, "--tool", "send_email", "--args", `{"to":"bob@example.com"}`, "--wait", "55s")
	}()
	_, err = reads.NextMsgWithContext(t.Context())
	require.NoError(t, err, "the TypeScript client watches its key")
	require.NoError(t, reads.Unsubscribe())
	cl, err := client.New(nc, client.WithReplyGrace(500*time.Millisecond))
	require.NoError(t, err)
	sub, err := cl.Publish(t.Context(), &intent.Envelope{Tool: "send_email", Args: []byte(`{"to":"ada@example.com"}`)})
	require.NoError(t, err)
	require.False(t, sub.Duplicate, "stored and acknowledged")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	answered := make(chan error, 1)
	var res *intent.Result
	go func() {
		var err error
		res, err = sub.Wait(ctx)
		answered <- err
	}()

	// The server has written the intent (to its page cache): kill it, and
	// take away what was written since the last sync.
	until(t, "both intents reach the work stream's block file", func() bool {
		st, err := js.Stream(t.Context(), names.Stream)
		_, n := srv.lastBlock(t, names.Stream)
		return err == nil && st.CachedInfo().State.Msgs == 2 && n > before
	})
	srv.p.kill()
	require.NoError(t, os.Truncate(block, before))
	srv.start(t)

	// The acknowledged intents are gone: no message in the work stream
	// carries the message id of either (a republished copy carries a fresh
	// one).
	st, err = js.Stream(t.Context(), names.Stream)
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			continue
		}
		id := m.Header.Get(intent.HeaderMsgID)
		require.Falsef(t, id == sub.Key || !strings.Contains(id, ":"), "an acknowledged intent (%s) survived the simulated power loss", id)
	}

	w2 := startWorker(t, "w2", srv.url, tools)
	require.NoError(t, <-answered, "the caller of the lost intent gets its answer")
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.False(t, res.Replayed, "fired by this call's own republished copy")
	require.Positive(t, sub.Republished(), "the submission counts its publishes under the retry rule")
	require.Equal(t, sub.Key, res.Key)
	ts := <-tsDone
	require.Equal(t, 0, ts.code, "the TypeScript caller of the lost intent gets its answer: %s %s", ts.stdout, ts.stderr)
	require.Equal(t, intent.StatusCompleted, ts.res.Status)
	require.False(t, ts.res.Replayed, "fired by the TypeScript call's own republished copy")
	require.NoError(t, w2.terminate(30*time.Second))
	keys := map[string]int{}
	for _, h := range hook.all() {
		keys[h.Key]++
	}
	require.Equal(t, map[string]int{sub.Key: 1, ts.res.Key: 1}, keys, "each operation fired exactly once, under its key")
}
