package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A receipt binds its run. An operation forgotten and run again gets a
// receipt of its own each run, which does not verify for the other run's
// answer; a takeover's answer and receipt count the vanished holder's
// firing among the attempts, as many as the trail's fired events.
func TestReceiptsBindTheirRun(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select { // the first firing hangs: its worker is killed meanwhile
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"sent":true,"n":%d}`, n)
	})
	defer close(release)
	tools := writeTools(t, fmt.Sprintf(`tools:
  send_email:
    effect: webhook
    key_args: [to]
    lease: 2s
    webhook: {url: %s/email, timeout: 60s}
  echo:
    effect: noop
    key_args: [n]
  charge:
    effect: noop
    key_args: [order]
    on_complete: reject
`, hook.URL))
	keyDir := t.TempDir()
	workers := map[string]*proc{}
	for _, name := range []string{"w1", "w2"} {
		workers[name] = startWorker(t, name, url, tools, "--ack-wait", "2s", "--audit-key", filepath.Join(keyDir, name+".key"))
	}
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	ks := submit(t, url, "audit", "keys")
	require.Equal(t, 0, ks.code, ks.stderr)
	require.NoError(t, os.WriteFile(keysFile, []byte(ks.stdout), 0o644))
	keys, err := audit.LoadKeys(keysFile)
	require.NoError(t, err)
	nc := connect(t, url)

	// Two runs of one key, an operator's forget between them.
	envelope := []byte(`{"tool":"echo","args":{"n":1}}`)
	run1 := publishRaw(t, nc, "idem.intents.echo", envelope)(30 * time.Second)
	require.Equal(t, intent.StatusCompleted, run1.Status)
	forgot := submit(t, url, "forget", run1.Key, "--by", "ops", "--reason", "run it again")
	require.Equal(t, 0, forgot.code, forgot.stdout+forgot.stderr)
	run2 := publishRaw(t, nc, "idem.intents.echo", envelope)(30 * time.Second)
	require.Equal(t, intent.StatusCompleted, run2.Status)
	require.False(t, run2.Replayed, "the forgotten operation ran again")
	require.NotEqual(t, run1.IntentSeq, run2.IntentSeq, "each run names its intent")
	for _, run := range []intent.Result{run1, run2} {
		_, err := audit.VerifyReceipt(run, keys)
		require.NoError(t, err, "a run's receipt verifies for its answer")
	}
	swapped1, swapped2 := run1, run2
	swapped1.Receipt, swapped2.Receipt = run2.Receipt, run1.Receipt
	_, err = audit.VerifyReceipt(swapped1, keys)
	require.ErrorIs(t, err, audit.ErrReceiptMismatch, "run 2's receipt on run 1's answer")
	_, err = audit.VerifyReceipt(swapped2, keys)
	require.ErrorIs(t, err, audit.ErrReceiptMismatch, "run 1's receipt on run 2's answer")

	// A repeat of a completion its tool refuses: already_done, with the
	// completion's receipt, which verifies for it (and a client with the
	// keys accepts it).
	charge := []byte(`{"tool":"charge","args":{"order":"o-1"}}`)
	charged := publishRaw(t, nc, "idem.intents.charge", charge)(30 * time.Second)
	require.Equal(t, intent.StatusCompleted, charged.Status)
	again := publishRaw(t, nc, "idem.intents.charge", charge)(30 * time.Second)
	require.Equal(t, intent.StatusAlreadyDone, again.Status)
	require.JSONEq(t, string(charged.Receipt), string(again.Receipt), "the completion's receipt")
	_, err = audit.VerifyReceipt(again, keys)
	require.NoError(t, err, "an already_done answer's receipt verifies")
	forged := again
	forged.Result = []byte(`{"charged":"twice"}`)
	_, err = audit.VerifyReceipt(forged, keys)
	require.ErrorIs(t, err, audit.ErrReceiptMismatch, "an already_done answer with another result")
	vcl, err := client.New(nc, client.WithReceiptKeys(keys))
	require.NoError(t, err)
	kctx, kcancel := context.WithTimeout(context.Background(), time.Minute)
	defer kcancel()
	res, err := vcl.Submit(kctx, &intent.Envelope{Tool: "charge", Args: []byte(`{"order":"o-1"}`)})
	require.NoError(t, err, "the client accepts the already_done answer's receipt")
	require.Equal(t, intent.StatusAlreadyDone, res.Status)

	// A takeover: the holder dies mid-effect, the other worker fires again.
	final := make(chan submitted, 1)
	go func() {
		final <- submit(t, url, "--tool", "send_email", "--args", `{"to":"ada@example.com"}`, "--wait", "90s")
	}()
	first := hook.waitHit(t, 30*time.Second)
	// Its firing in the trail before it dies (a killed worker loses the
	// events it still holds).
	waitHistory(t, url, first.Key, kind(audit.KindFired), "the first firing")
	cl, err := client.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec, err := cl.Get(ctx, first.Key)
	require.NoError(t, err)
	workers[rec.Holder].kill()
	mail := <-final
	require.Equal(t, intent.StatusCompleted, mail.res.Status, mail.stdout+mail.stderr)
	require.Equal(t, 2, hook.count(), "fired twice")
	require.Equal(t, 2, mail.res.Attempts, "the answer counts the vanished holder's firing")
	ev, err := audit.VerifyReceipt(mail.res, keys)
	require.NoError(t, err)
	require.Equal(t, 2, ev.Attempts, "the receipt counts the vanished holder's firing")
	require.Equal(t, 2, ev.Attempt)
	h := waitHistory(t, url, first.Key, kind(audit.KindOutcome), "the outcome")
	fired := 0
	for _, e := range h {
		if e.Event.Kind == audit.KindFired {
			fired++
		}
	}
	require.Equal(t, fired, ev.Attempts, "as many attempts as fired events in the trail")
}
