package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// An attacker who learned a victim's inbox, key and fingerprint (keys are
// derivable, inboxes leak) publishes intents of its own naming them in
// Idem-Reply-To, Idem-Key and Idem-Fingerprint: one that is not JSON, one
// with an unknown field, one whose arguments derive another key. The
// workers answer each on the victim's inbox (rejected: invalid_intent, or
// key_mismatch). Every client — submit (Go), the TypeScript client, the
// HTTP front door and the MCP server — drops those answers, which are bound
// to the attacker's messages, keeps waiting, and reports its own operation's
// real completed answer once the slow downstream lets it finish.
func TestForgedAnswersDoNotReachTheVictims(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	release := make(chan struct{})
	var once sync.Once
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select { // slow: every victim waits while the attacker acts
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"sent":true,"n":%d}`, n)
	})
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))
	gw := startGateway(t, url)
	session := stdioSession(t, url, nil)

	// The attacker's view of the victims' intents (in production: a leaked
	// inbox and a derivable key).
	spy := connect(t, url)
	seen := make(chan *nats.Msg, 64)
	sub, err := spy.ChanSubscribe("idem.intents.send_email", seen)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, spy.Flush())

	args := func(who string) string { return fmt.Sprintf(`{"to":"%s@example.com","subject":"Welcome"}`, who) }
	type outcome struct {
		who    string
		status intent.Status
		res    string
		err    string
	}
	outcomes := make(chan outcome, 4)
	go func() {
		s := submit(t, url, "--tool", "send_email", "--args", args("go"), "--wait", "120s")
		outcomes <- outcome{"go", s.res.Status, string(s.res.Result), fmt.Sprintf("exit %d: %s %s", s.code, s.stdout, s.stderr)}
	}()
	go func() {
		s := tsSubmit(t, dir, url, "--tool", "send_email", "--args", args("ts"), "--wait", "120s")
		outcomes <- outcome{"ts", s.res.Status, string(s.res.Result), fmt.Sprintf("exit %d: %s %s", s.code, s.stdout, s.stderr)}
	}()
	go func() {
		o := outcome{who: "http"}
		defer func() { outcomes <- o }()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.url+"/v1/tools/send_email", strings.NewReader(args("http")))
		if err != nil {
			o.err = err.Error()
			return
		}
		req.Header.Set("Authorization", "Bearer "+gw.tokens[agentA])
		req.Header.Set("Prefer", "wait=120")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			o.err = err.Error()
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var res intent.Result
		_ = json.Unmarshal(body, &res)
		o.status, o.res, o.err = res.Status, string(res.Result), fmt.Sprintf("HTTP %d: %s", resp.StatusCode, body)
	}()
	go func() {
		o := outcome{who: "mcp"}
		defer func() { outcomes <- o }()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "send_email", Arguments: json.RawMessage(args("mcp"))})
		if err != nil {
			o.err = err.Error()
			return
		}
		var op struct{ Status intent.Status }
		data, _ := json.Marshal(res.Meta["io.idemgate/operation"])
		_ = json.Unmarshal(data, &op)
		o.status, o.res, o.err = op.Status, mcpText(res), fmt.Sprintf("error %v: %s", res.IsError, mcpText(res))
		if res.IsError {
			o.status = ""
		}
	}()

	attacker := connect(t, url)
	js, err := jetstreamFor(attacker)
	require.NoError(t, err)
	garbage := [][]byte{
		[]byte(`{"tool":"send_email","args":`), // not JSON
		[]byte(`{"tool":"send_email","args":{"to":"x@example.com","subject":"Welcome"},"priority":"high"}`), // an unknown field
		[]byte(`{"tool":"send_email","args":{"to":"mallory@example.com","subject":"Welcome"}}`),             // another key
	}
	for victims := 0; victims < 4; {
		var m *nats.Msg
		select {
		case m = <-seen:
		case <-time.After(2 * time.Minute):
			t.Fatalf("only %d victims published", victims)
		}
		if !strings.Contains(string(m.Data), `@example.com`) || strings.Contains(string(m.Data), "mallory") || strings.Contains(string(m.Data), "x@example.com") {
			continue // the attacker's own
		}
		victims++
		inbox := m.Header.Get(intent.HeaderReplyTo)
		require.NotEmpty(t, inbox, "%s", m.Data)
		watch, err := spy.SubscribeSync(inbox) // to see the forged answers arrive
		require.NoError(t, err)
		require.NoError(t, spy.Flush())
		for _, body := range garbage {
			forged := nats.NewMsg("idem.intents.send_email")
			forged.Data = body
			for _, h := range []string{intent.HeaderReplyTo, intent.HeaderKey, intent.HeaderFingerprint} {
				forged.Header.Set(h, m.Header.Get(h))
			}
			_, err := js.PublishMsg(t.Context(), forged)
			require.NoError(t, err)
		}
		for range garbage {
			a, err := watch.NextMsg(time.Minute)
			require.NoError(t, err, "the workers answer the attacker's intents on the victim's inbox (%s)", m.Data)
			require.Contains(t, string(a.Data), `"rejected"`)
		}
		require.NoError(t, watch.Unsubscribe())
	}
	unblock()

	for range 4 {
		o := <-outcomes
		require.Equal(t, intent.StatusCompleted, o.status, "%s: %s", o.who, o.err)
		require.Contains(t, strings.Join(strings.Fields(o.res), ""), `"sent":true`, "%s: the real answer: %s", o.who, o.err)
	}
	require.Equal(t, 4, hook.count(), "each victim's operation fired once; the attacker's none")
}

// A forger who kept a run's whole answer, receipt and all, replays it to a
// caller of a later run of the same key (forgotten and run again): on the
// caller's inbox, bound to the caller's publish by its Idem-Intent-Seq
// header, saying it is not replayed. Its receipt verifies. The Go and
// TypeScript clients and the HTTP front door drop it — an answer that is
// not a replay names the run of the publish it answers — and report the
// later run's own answer once the slow downstream lets it finish.
func TestForgedAnswerOfAnotherRunIsDropped(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	victims := []string{"go", "ts", "http"}
	release := make(chan struct{})
	var once sync.Once
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n > len(victims) { // the second runs wait while the forger acts
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"sent":true,"n":%d}`, n)
	})
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))
	gw := startGateway(t, url)
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	ks := submit(t, url, "audit", "keys")
	require.Equal(t, 0, ks.code, ks.stderr)
	require.NoError(t, os.WriteFile(keysFile, []byte(ks.stdout), 0o644))
	keys, err := audit.LoadKeys(keysFile)
	require.NoError(t, err)
	nc := connect(t, url)
	args := func(who string) string { return fmt.Sprintf(`{"to":"%s@example.com","subject":"Welcome"}`, who) }
	viaHTTP := func() response {
		return gw.do(t, http.MethodPost, "/v1/tools/send_email", agentA, args("http"), "Prefer", "wait=50")
	}

	// Run 1 of each victim's key, whose answer the forger keeps; then an
	// operator forgets the key.
	kept := map[string][]byte{}
	first := map[string]uint64{}
	for _, who := range victims {
		var run1 intent.Result
		if who == "http" {
			r := viaHTTP()
			require.Equal(t, http.StatusOK, r.status, r.raw)
			run1 = r.answer(t)
		} else {
			run1 = publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":`+args(who)+`}`))(time.Minute)
		}
		require.Equal(t, intent.StatusCompleted, run1.Status)
		require.False(t, run1.Replayed)
		_, err := audit.VerifyReceipt(run1, keys)
		require.NoError(t, err, "run 1's receipt verifies for its answer")
		kept[who], err = run1.AppendJSON(nil)
		require.NoError(t, err)
		first[who] = run1.IntentSeq
		forgot := submit(t, url, "forget", run1.Key, "--by", "ops", "--reason", "run it again")
		require.Equal(t, 0, forgot.code, forgot.stdout+forgot.stderr)
	}

	// The forger's view of the victims' intents (in production: a leaked
	// inbox), and of the work stream, for their sequences (which only grow).
	spy := connect(t, url)
	seen := make(chan *nats.Msg, 8)
	sub, err := spy.ChanSubscribe("idem.intents.send_email", seen)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, spy.Flush())
	sjs, err := jetstreamFor(spy)
	require.NoError(t, err)
	stream, err := sjs.Stream(t.Context(), "IDEM_INTENTS")
	require.NoError(t, err)
	sequence := func(data []byte) uint64 { // the spy may see an intent before the stream stores it
		for t.Context().Err() == nil {
			info, err := stream.Info(t.Context())
			require.NoError(t, err)
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
				if m, err := stream.GetMsg(t.Context(), seq); err == nil && string(m.Data) == string(data) {
					return seq
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no stored intent %s", data)
		return 0
	}

	// Run 2 of each key.
	type outcome struct {
		who string
		res intent.Result
		err string
	}
	outcomes := make(chan outcome, len(victims))
	go func() {
		o := outcome{who: "go"}
		defer func() { outcomes <- o }()
		cl, err := client.New(connect(t, url), client.WithReceiptKeys(keys))
		if err != nil {
			o.err = err.Error()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := cl.Submit(ctx, &intent.Envelope{Tool: "send_email", Args: json.RawMessage(args("go"))})
		if res != nil {
			o.res = *res
		}
		if err != nil {
			o.err = err.Error()
		}
	}()
	go func() {
		s := tsSubmit(t, dir, url, "--tool", "send_email", "--args", args("ts"), "--receipt-keys", keysFile, "--wait", "120s")
		outcomes <- outcome{"ts", s.res, fmt.Sprintf("exit %d: %s %s", s.code, s.stdout, s.stderr)}
	}()
	go func() {
		r := viaHTTP()
		o := outcome{who: "http", err: fmt.Sprintf("HTTP %d: %s", r.status, r.raw)}
		if r.status == http.StatusOK {
			o.res = r.answer(t)
		}
		outcomes <- o
	}()

	forger := connect(t, url)
	for forged := 0; forged < len(victims); forged++ {
		var m *nats.Msg
		select {
		case m = <-seen:
		case <-t.Context().Done():
			t.Fatalf("only %d victims published", forged)
		}
		var env struct {
			Args struct{ To string } `json:"args"`
		}
		require.NoError(t, json.Unmarshal(m.Data, &env))
		who, _, _ := strings.Cut(env.Args.To, "@")
		answer, ok := kept[who]
		require.True(t, ok, "an intent of no victim: %s", m.Data)
		out := nats.NewMsg(m.Header.Get(intent.HeaderReplyTo))
		out.Data = answer
		out.Header.Set(intent.HeaderIntentSeq, strconv.FormatUint(sequence(m.Data), 10))
		require.NoError(t, forger.PublishMsg(out))
	}
	require.NoError(t, forger.Flush())
	unblock()

	for range victims {
		o := <-outcomes
		if !assert.Equal(t, intent.StatusCompleted, o.res.Status, "%s: %s", o.who, o.err) ||
			!assert.NotEqual(t, first[o.who], o.res.IntentSeq, "%s took run 1's answer for its own: %s", o.who, o.res.Result) {
			continue
		}
		var got struct{ N int }
		require.NoError(t, json.Unmarshal(o.res.Result, &got), "%s: %s", o.who, o.err)
		assert.Greater(t, got.N, len(victims), "%s: run 2's own result, not run 1's: %s", o.who, o.res.Result)
		assert.False(t, o.res.Replayed, o.who)
		_, err := audit.VerifyReceipt(o.res, keys)
		assert.NoError(t, err, "%s: run 2's receipt verifies, as a caller of the front door checks it", o.who)
	}
	require.Equal(t, 2*len(victims), hook.count(), "each run fired once")
}
