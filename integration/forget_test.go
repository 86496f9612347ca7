package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// arrivalRelay forwards TCP connections to target (host:port) and reports on
// arrived each time a connection's first bytes (a request) pass towards
// target.
func arrivalRelay(t *testing.T, target string) (addr string, arrived <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan struct{}, 16)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go func() {
				buf := make([]byte, 32<<10)
				first := true
				for {
					n, err := in.Read(buf)
					if n > 0 {
						if _, werr := out.Write(buf[:n]); werr != nil {
							return
						}
						if first {
							first = false
							ch <- struct{}{}
						}
					}
					if err != nil {
						_ = out.(*net.TCPConn).CloseWrite()
						return
					}
				}
			}()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return ln.Addr().String(), ch
}

// ledgerWatches returns a function counting the watches of the record
// stored under stored in the ledger's first partition: consumers filtered
// on its subject (a worker's or a forget's wait) and subscriptions to it (a
// client's wait for an answer). url is a server jetStream started.
func ledgerWatches(t *testing.T, ctx context.Context, url, stored string) func() int {
	t.Helper()
	js, err := jetstreamFor(connect(t, url))
	require.NoError(t, err)
	subject := "$KV.IDEM_LEDGER." + stored
	return func() int {
		stream, err := js.Stream(ctx, "KV_IDEM_LEDGER")
		require.NoError(t, err)
		n := 0
		lister := stream.ListConsumers(ctx)
		for info := range lister.Info() {
			if info.Config.FilterSubject == subject || slices.Contains(info.Config.FilterSubjects, subject) {
				n++
			}
		}
		require.NoError(t, lister.Err())
		return n + subscriptions(t, url, subject)
	}
}

// submitAsync runs the submit binary in the background; its result arrives
// on the channel once it exits.
func submitAsync(t *testing.T, url string, args ...string) <-chan submitted {
	t.Helper()
	n := 0
	for n < len(args) && !strings.HasPrefix(args[n], "-") {
		n++
	}
	full := append(append(append([]string{}, args[:n]...), "--nats-url", url), args[n:]...)
	cmd := exec.Command(bin("submit"), full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ch := make(chan submitted, 1)
	go func() {
		err := cmd.Wait()
		s := submitted{code: -1, stdout: out.String(), stderr: errb.String()}
		var ee *exec.ExitError
		switch {
		case err == nil:
			s.code = 0
		case errors.As(err, &ee):
			s.code = ee.ExitCode()
		}
		_ = json.Unmarshal(out.Bytes(), &s.res)
		ch <- s
	}()
	return ch
}

// receive waits for a background submit, bounded by ctx.
func receive(t *testing.T, ctx context.Context, ch <-chan submitted, what string) submitted {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-ctx.Done():
		t.Fatalf("%s did not end: %v", what, ctx.Err())
		return submitted{}
	}
}

// Hole 2 of the trust issue: a holder that is only stalled past its lease
// (a GC pause, a VM stall, a partition: here SIGSTOP) is still firing. The
// operator's forget is refused unless forced, and refused forced while the
// holder is alive; the caller's retry waits for the holder's answer; the
// holder wakes and finishes. The real sink saw the operation once.
func TestForgetOfAStalledHolderFiresOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := jetStream(t)
	sink := startRealSink(t, "--hold", "2s") // the effect runs long
	addr, arrived := arrivalRelay(t, strings.TrimPrefix(sink.url, "http://"))
	tools := writeTools(t, fmt.Sprintf(`tools:
  slow_ticket:
    effect: webhook
    lease: 6s
    key_args: [title]
    webhook: {url: "http://%s/tickets", timeout: 60s}
`, addr))
	holder := startWorker(t, "w1", url, tools)
	gw := startGateway(t, url)
	args := []string{"--tool", "slow_ticket", "--args", `{"title":"Printer on fire"}`, "--session", "run-7"}
	keyOut := submit(t, url, append([]string{"key", "-q", "--tools", tools, "--webhook-allow", "127.0.0.0/8"}, args...)...)
	require.Equal(t, 0, keyOut.code, keyOut.stderr)
	key := strings.TrimSpace(keyOut.stdout)
	storedOut := submit(t, url, append([]string{"key", "-l", "--tools", tools, "--webhook-allow", "127.0.0.0/8"}, args...)...)
	require.Equal(t, 0, storedOut.code, storedOut.stderr)
	watches := ledgerWatches(t, ctx, url, strings.TrimSpace(storedOut.stdout))

	first := submitAsync(t, url, args...)
	select {
	case <-arrived:
	case <-ctx.Done():
		t.Fatal("the effect never reached the sink")
	}
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGSTOP), "the holder stalls mid-effect")
	resumed := false
	defer func() {
		if !resumed {
			_ = holder.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	// A second live worker, ready to fire a retry.
	live := launchWorker(t, "w2", []string{"--tools", tools, "--holder", "w2", "--log-level", "debug",
		"--webhook-allow", "127.0.0.0/8", "--nats-url", url}, nil)

	// Past the holder's lease.
	got := gw.do(t, http.MethodGet, "/v1/operations/"+key, operator, "")
	require.Equal(t, http.StatusOK, got.status, got.raw)
	require.Equal(t, "pending", got.str("status"))
	require.Equal(t, "w1", got.str("holder"))
	time.Sleep(time.Until(parseTime(t, got.str("lease_until"))))

	// Not forced: refused, saying what forcing risks.
	refused := gw.do(t, http.MethodDelete, "/v1/operations/"+key, operator, "")
	assert.Equal(t, http.StatusConflict, refused.status, refused.raw)
	assert.Equal(t, "unresolved", refused.str("code"), refused.raw)
	assert.Contains(t, refused.str("detail"), "stalled", refused.raw)
	assert.Contains(t, refused.str("detail"), "force=true", refused.raw)

	// Forced, while the holder is stalled: it watches the record for one
	// more lease. Then the caller retries, and the holder wakes. (The first
	// call watches the record too, once its reply is late: counted first.
	// The holder must not wake before the forget has read the record: the
	// sink's answer waits in its socket, and a forget that found the
	// operation completed would rightly forget it.)
	require.Eventually(t, func() bool { return watches() >= 1 }, time.Minute, 5*time.Millisecond, "the first call watches the record")
	before := watches()
	forced := make(chan response, 1)
	go func() { forced <- gw.do(t, http.MethodDelete, "/v1/operations/"+key+"?force=true", operator, "") }()
	var f response
	forcedDone := false
	require.Eventually(t, func() bool {
		select {
		case f = <-forced:
			forcedDone = true
			return true
		default:
			return watches() > before
		}
	}, time.Minute, 5*time.Millisecond, "the forced forget watches the record (or answers)")
	require.NotEqual(t, http.StatusOK, f.status, "not forgotten while the holder is stalled: %s", f.raw)
	retry := submitAsync(t, url, args...)
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGCONT))
	resumed = true
	live.waitLog(t, "worker consuming", 20*time.Second)

	if !forcedDone {
		select {
		case f = <-forced:
		case <-ctx.Done():
			t.Fatal("the forced forget did not answer")
		}
	}
	assert.Equal(t, http.StatusConflict, f.status, "refused: the holder is alive\n%s", f.raw)
	assert.Equal(t, "in_flight", f.str("code"), f.raw)
	done := receive(t, ctx, first, "the first call")
	require.Equal(t, intent.StatusCompleted, done.res.Status, done.stdout+done.stderr)
	again := receive(t, ctx, retry, "the retry")
	require.Equal(t, intent.StatusCompleted, again.res.Status, again.stdout+again.stderr)
	require.JSONEq(t, string(done.res.Result), string(again.res.Result), "the retry gets the holder's result")
	require.Equal(t, 1, sink.firings(t, key), "the sink saw the operation once")
}

// A forget by the operation's key or by the key a compact ledger stores
// (what listings show) reaches every worker's answer cache: with three
// workers whose caches answer the operation, the next calls after the
// forget fire it again, exactly once. Meanwhile the forgotten record says
// who forgot it, when and why (submit get).
func TestForgetClearsEveryAnswerCache(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	url := jetStream(t)
	sink := startRealSink(t)
	tools := writeTools(t, fmt.Sprintf(`tools:
  ticket:
    effect: webhook
    key_args: [title]
    webhook: {url: "%s/tickets"}
`, sink.url))
	var admins []string
	for i := range 3 {
		admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		admins = append(admins, admin)
		startWorker(t, fmt.Sprintf("w%d", i+1), url, tools, "--answer-cache", "10m", "--admin-addr", admin)
	}
	nc := connect(t, url)
	hits := func(admin string) float64 { return scrape(t, admin)[`idemgate_answer_cache_hits_total{tool="ticket"}`] }
	for _, c := range []struct {
		title  string
		stored bool // forget by the stored key, else by the operation's
	}{{"Disk full", true}, {"Printer jam", false}} {
		args := fmt.Sprintf(`{"title":%q}`, c.title)
		envelope := fmt.Sprintf(`{"tool":"ticket","args":%s,"session":"ops"}`, args)
		first := submit(t, url, "--tool", "ticket", "--args", args, "--session", "ops")
		require.Equal(t, 0, first.code, first.stdout+first.stderr)
		key := first.res.Key
		ledgerKey := submit(t, url, "key", "-l", "--tool", "ticket", "--args", args, "--session", "ops")
		require.Equal(t, 0, ledgerKey.code, ledgerKey.stderr)
		stored := strings.TrimSpace(ledgerKey.stdout)
		require.NotEqual(t, key, stored, "a new ledger stores compact keys")

		// Warm every worker's cache: repeats (no Nats-Msg-Id, so publish
		// dedup does not hide them) until each worker answered one from its
		// cache.
		before := map[string]float64{}
		for _, a := range admins {
			before[a] = hits(a)
		}
		for warm := false; !warm; {
			require.NoError(t, ctx.Err(), "every worker answers from its cache")
			res := publishRaw(t, nc, "idem.intents.ticket", []byte(envelope))(30 * time.Second)
			require.True(t, res.Replayed, "a repeat is replayed")
			warm = true
			for _, a := range admins {
				warm = warm && hits(a) > before[a]
			}
		}

		named := key
		if c.stored {
			named = stored
		}
		forgot := submit(t, url, "forget", named, "--by", "bob", "--reason", "ticket closed by mistake")
		require.Equal(t, 0, forgot.code, forgot.stdout+forgot.stderr)
		shown := submit(t, url, "get", named)
		require.Equal(t, 0, shown.code, shown.stderr)
		require.Equal(t, intent.StatusForgotten, shown.res.Status, shown.stdout)
		require.Regexp(t, `forgotten by bob at \S+: ticket closed by mistake`, shown.stderr)

		// Repeats spread over the workers: one fires, the others are
		// replays of its new record.
		fired := 0
		for i := range 9 {
			res := publishRaw(t, nc, "idem.intents.ticket", []byte(envelope))(30 * time.Second)
			require.Equal(t, intent.StatusCompleted, res.Status, "repeat %d", i)
			if !res.Replayed {
				fired++
			}
		}
		require.Equal(t, 1, fired, "fired again once after the forget (by %s)", named)
		require.Equal(t, 2, sink.firings(t, key), "the sink saw the first firing and the one after the forget")
	}
}

// submit forget refuses an unresolved operation, saying what forcing risks
// and how; --force forgets it, and the next call asks for approval again.
func TestSubmitForgetRefusesUnresolved(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, `tools:
  refund:
    effect: noop
    key_args: [order_id]
    approval: required
`))
	args := []string{"--tool", "refund", "--args", `{"order_id":"o-9"}`}
	parked := submit(t, url, args...)
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status, parked.stdout+parked.stderr)

	refused := submit(t, url, "forget", parked.res.Key)
	require.Equal(t, 6, refused.code, refused.stderr)
	require.Contains(t, refused.stderr, "awaiting approval")
	require.Contains(t, refused.stderr, "submit forget --force "+parked.res.Key)

	forced := submit(t, url, "forget", parked.res.Key, "--force")
	require.Equal(t, 0, forced.code, forced.stderr)
	require.Contains(t, forced.stdout, `"status": "awaiting_approval"`, "it prints the record it removed")
	again := submit(t, url, args...)
	require.Equal(t, intent.StatusAwaitingApproval, again.res.Status, again.stdout+again.stderr)
	require.False(t, again.res.Replayed, "a new request for approval")
}
