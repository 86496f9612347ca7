package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// sinkRequest is one request cmd/sink logged.
type sinkRequest struct {
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	Status  int    `json:"status"`
}

// requestsFor is every request of key the sink logged, in order.
func (s *realSink) requestsFor(t *testing.T, key string) []sinkRequest {
	t.Helper()
	data, err := os.ReadFile(s.log)
	require.NoError(t, err)
	var out []sinkRequest
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e sinkRequest
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e), sc.Text())
		if e.Key == key {
			out = append(out, e)
		}
	}
	return out
}

// A copy of a call whose operation failed never fires it again, however it
// reached the worker; only a new call does. The race: a tool with
// on_failure: retry and max_in_flight: 1 whose downstream (cmd/sink) answers
// each key's first request 422 after a hold; two calls a moment apart. The
// second waits under the cap past its client's reply grace with no record,
// so its client publishes it again (protocol 7.2; such a tool's intents
// carry no Nats-Msg-Id, so the copy is stored). The first copy of the
// second call fires and fails, and its caller is told failed; the second
// copy must then be answered from the failed record, not fire again. A new
// call after the failure runs it again, as on_failure: retry promises.
func TestFailedCallCopyNeverFiresAgain(t *testing.T) {
	t.Parallel()
	skipShort(t, "two calls behind a slow downstream that answers 422")
	url := jetStream(t)
	const hold = 3 * time.Second
	down := startRealSink(t, "--fail-first", "422", "--hold", hold.String())
	tools := writeTools(t, fmt.Sprintf(`tools:
  notify:
    effect: webhook
    key_args: [to]
    on_failure: retry
    max_in_flight: 1
    webhook: {url: %s/notify, timeout: 30s}
`, down.url))
	startWorker(t, "w1", url, tools)

	nc := connect(t, url)
	grace := time.Second // under the hold: the second call's client republishes it
	cl, err := client.New(nc, client.WithReplyGrace(grace))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	call := func(to string) *client.Submission {
		sub, err := cl.Publish(ctx, &intent.Envelope{Tool: "notify", Args: []byte(fmt.Sprintf(`{"to":%q}`, to))})
		require.NoError(t, err)
		return sub
	}
	type answer struct {
		res *intent.Result
		err error
	}
	wait := func(sub *client.Submission) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			res, err := sub.Wait(ctx)
			ch <- answer{res, err}
		}()
		return ch
	}

	first := call("ada")
	firstDone := wait(first)
	time.Sleep(300 * time.Millisecond) // the race: a second call a moment later
	second := call("bob")
	secondDone := wait(second)

	for _, c := range []struct {
		name string
		sub  *client.Submission
		done <-chan answer
	}{{"first", first, firstDone}, {"second", second, secondDone}} {
		a := <-c.done
		require.NoError(t, a.err, "the %s caller is answered", c.name)
		require.Equal(t, intent.StatusFailed, a.res.Status, "the %s caller is told its call failed", c.name)
		require.False(t, a.res.Replayed, "the %s caller's own call failed", c.name)
	}

	// Every copy is handled: the work stream's consumer has nothing left.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	names, err := intent.NewNames("")
	require.NoError(t, err)
	until(t, "the worker handled every copy", func() bool {
		ci, err := js.Consumer(ctx, names.Stream, names.Consumer)
		if err != nil {
			return false
		}
		info, err := ci.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	st, err := js.Stream(ctx, names.Stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, info.State.LastSeq, uint64(3), "the race happened: the second call was published again while it waited")

	require.Equal(t, []sinkRequest{{Key: first.Key, Attempt: 1, Status: 422}}, down.requestsFor(t, first.Key))
	require.Equal(t, []sinkRequest{{Key: second.Key, Attempt: 1, Status: 422}}, down.requestsFor(t, second.Key),
		"the downstream sees the second operation once: the copy of the call that failed never fires it again")
	rec, err := cl.Get(ctx, second.Key)
	require.NoError(t, err)
	require.Equal(t, intent.StatusFailed, rec.Status)
	require.Len(t, rec.Submissions, 1, "one call ran it")

	// The caller saw the failure and calls again: a new call runs it again.
	again := call("bob")
	a := <-wait(again)
	require.NoError(t, a.err)
	require.Equal(t, intent.StatusCompleted, a.res.Status, "a new call after the failure runs the operation again")
	require.False(t, a.res.Replayed)
	require.Equal(t, []sinkRequest{{Key: second.Key, Attempt: 1, Status: 422}, {Key: second.Key, Attempt: 2, Status: 200}},
		down.requestsFor(t, second.Key))
}

// The HTTP front door passes a request's Idem-Submission on, so that a
// caller's repeat of one call (the Python client repeats a request that
// was answered 409 in flight, with the same header) is a copy of the call:
// when the call's operation fails, the repeat waiting behind the tool's cap
// is answered with the failure and fires nothing. A request naming another
// call runs it again.
func TestHTTPRepeatOfAFailedCallNeverFiresAgain(t *testing.T) {
	t.Parallel()
	skipShort(t, "repeats of one call behind a slow downstream that answers 422")
	url := jetStream(t)
	down := startRealSink(t, "--fail-first", "422", "--hold", "3s")
	tools := writeTools(t, fmt.Sprintf(`tools:
  notify:
    effect: webhook
    key_args: [to]
    on_failure: retry
    max_in_flight: 1
    webhook: {url: %s/notify, timeout: 30s}
`, down.url))
	startWorker(t, "w1", url, tools)
	gw := startGateway(t, url)
	nc := connect(t, url)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	names, err := intent.NewNames("")
	require.NoError(t, err)

	// Another operation holds the tool's only slot for the downstream's hold.
	blocker := make(chan response, 1)
	go func() { blocker <- gw.call(t, agentA, "notify", `{"to":"ada"}`, "Prefer", "wait=60") }()
	until(t, "the blocking call is published", func() bool {
		st, err := js.Stream(t.Context(), names.Stream)
		return err == nil && st.CachedInfo().State.LastSeq >= 1
	})

	const call = "call-0123456789abcdef"
	first := gw.call(t, agentA, "notify", `{"to":"bob"}`, "Prefer", "wait=1", "Idem-Submission", call)
	requireProblem(t, first, http.StatusConflict, "in_flight") // waiting under the cap
	repeat := gw.call(t, agentA, "notify", `{"to":"bob"}`, "Prefer", "wait=60", "Idem-Submission", call)
	requireProblem(t, repeat, http.StatusBadGateway, intent.CodeEffectFailed)
	key := repeat.str("key")
	require.Equal(t, []sinkRequest{{Key: key, Attempt: 1, Status: 422}}, down.requestsFor(t, key),
		"the repeat of the call that failed fires nothing")
	requireProblem(t, <-blocker, http.StatusBadGateway, intent.CodeEffectFailed)

	bad := gw.call(t, agentA, "notify", `{"to":"bob"}`, "Idem-Submission", "no spaces")
	requireProblem(t, bad, http.StatusBadRequest, "invalid_request")

	again := gw.call(t, agentA, "notify", `{"to":"bob"}`, "Prefer", "wait=60")
	require.Equal(t, http.StatusOK, again.status, "a new call runs the failed operation again: %s", again.raw)
	require.Equal(t, []sinkRequest{{Key: key, Attempt: 1, Status: 422}, {Key: key, Attempt: 2, Status: 200}}, down.requestsFor(t, key))
}

// The TypeScript client names its call on every copy too: its republished
// copy of a call that failed, waiting behind the tool's cap, never fires
// the operation again; its next call does.
func TestTSCopyOfAFailedCallNeverFiresAgain(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	down := startRealSink(t, "--fail-first", "422", "--hold", "8s") // well past the client's 3 s reply grace
	tools := writeTools(t, fmt.Sprintf(`tools:
  notify:
    effect: webhook
    key_args: [to]
    on_failure: retry
    max_in_flight: 1
    webhook: {url: %s/notify, timeout: 30s}
`, down.url))
	startWorker(t, "w1", url, tools)
	nc := connect(t, url)
	cl, err := client.New(nc)
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	names, err := intent.NewNames("")
	require.NoError(t, err)

	blocker, err := cl.Publish(t.Context(), &intent.Envelope{Tool: "notify", Args: []byte(`{"to":"ada"}`)})
	require.NoError(t, err)
	failed := tsSubmit(t, dir, url, "--tool", "notify", "--args", `{"to":"bob"}`, "--wait", "55s")
	require.Equal(t, intent.StatusFailed, failed.res.Status, "%s\n%s", failed.stdout, failed.stderr)
	key := failed.res.Key
	res, err := blocker.Wait(t.Context())
	require.NoError(t, err)
	require.Equal(t, intent.StatusFailed, res.Status)

	until(t, "the worker handled every copy", func() bool {
		ci, err := js.Consumer(t.Context(), names.Stream, names.Consumer)
		if err != nil {
			return false
		}
		info, err := ci.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	st, err := js.Stream(t.Context(), names.Stream)
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	require.GreaterOrEqual(t, info.State.LastSeq, uint64(3), "the TypeScript client published its call again while it waited")
	require.Equal(t, []sinkRequest{{Key: key, Attempt: 1, Status: 422}}, down.requestsFor(t, key), "its copy never fired the operation again")

	again := tsSubmit(t, dir, url, "--tool", "notify", "--args", `{"to":"bob"}`, "--wait", "55s")
	require.Equal(t, intent.StatusCompleted, again.res.Status, "a new call runs it again: %s\n%s", again.stdout, again.stderr)
	require.Equal(t, []sinkRequest{{Key: key, Attempt: 1, Status: 422}, {Key: key, Attempt: 2, Status: 200}}, down.requestsFor(t, key))
}
