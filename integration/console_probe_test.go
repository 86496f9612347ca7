package integration

import (
	"net/http"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// An uncertain operation whose tool has a probe, and whose downstream (the
// real sink) has done it: its page (by its full key, which the downstream
// knows) offers "Probe now" and the command lines that do the same; pressed from the keyboard, it asks the
// downstream, and the page shows the evidence (verdict done) and the
// operation completed, with no second request downstream.
func TestConsoleProbe(t *testing.T) {
	t.Parallel()
	b := setupProbes(t, "--ledger-scan", "0") // only the operator probes here
	g := startGateway(t, b.url)
	key, l := b.abandon(t, "refund", `{"order":"o-console"}`, true)
	hold(t, l)
	require.Equal(t, 1, b.sink.firings(t, key))

	tb := openTab(t, g.direct)
	tb.login(g.tokens[operator])
	tb.open("/console/")
	tb.do(chromedp.WaitVisible(chromedp.CSS(item(ledgerKey(t, key)) + `[data-status="uncertain"]`)))

	tb.open("/console/op/" + key)
	tb.do(chromedp.WaitVisible(chromedp.CSS(`#decide form.resolve`)))
	require.Equal(t, 1, tb.count(`#decide form.probe button.probe`), "its tool has a probe: Probe now is offered")
	require.Zero(t, tb.count(`#probe`), "never probed yet: no evidence")
	cmds := tb.text(`#commands`)
	require.Contains(t, cmds, "bin/submit probe "+key)
	require.Contains(t, cmds, "/v1/operations/"+key+"/probe")

	tb.do(chromedp.Focus(chromedp.CSS(`#decide form.probe button.probe`)),
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, tb.text(`#flashes .flash`), "Probed: verdict done")
	tb.waitContains(`#probe`, "done downstream")
	probe := tb.text(`#probe`)
	require.Contains(t, probe, "GET "+b.sink.url+"/probe?key=")
	require.Contains(t, probe, "200 OK")
	require.Equal(t, "completed", tb.text(`h1.record-title .badge`))
	require.Zero(t, tb.count(`form.probe`), "a completed operation is not probed again")
	tb.do(chromedp.ScrollIntoView(chromedp.CSS(`#probe`)))
	tb.shot("probe")
	// Its history says what was asked and what the downstream answered.
	tb.waitHistory("probed", "the downstream answered done downstream; asked GET "+b.sink.url+"/probe?key=")
	require.NotContains(t, tb.text(`#history`), "does not describe")

	rec := g.do(t, http.MethodGet, "/v1/operations/"+key, operator, "")
	require.Equal(t, http.StatusOK, rec.status, rec.raw)
	require.Equal(t, string(intent.StatusCompleted), rec.str("status"), rec.raw)
	require.Equal(t, 1, b.sink.firings(t, key), "settled without a second request downstream")
}
