package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/intent"
)

// historyRow is a row of a record page's History, as the page shows it.
type historyRow struct {
	Kind, Signature, Link, Text string
}

// history reads the History rows of the tab's page.
func (b *tab) history() []historyRow {
	b.t.Helper()
	rows, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]historyRow](`[...document.querySelectorAll('#history tbody tr')].map(r =>
		({Kind: r.dataset.kind, Signature: r.dataset.signature, Link: r.dataset.link, Text: r.textContent.replace(/\s+/g, ' ').trim()}))`))
	require.NoError(b.t, err)
	return rows
}

// save writes a screenshot to screenshotDir/name.png.
func (b *tab) save(name string, png []byte) {
	b.t.Helper()
	require.NoError(b.t, os.MkdirAll(screenshotDir, 0o755))
	require.NoError(b.t, os.WriteFile(filepath.Join(screenshotDir, name+".png"), png, 0o644))
}

// waitHistory waits until the page's History has a row of kind whose text
// contains want: the page redraws it by itself when the trail grows.
func (b *tab) waitHistory(kind, want string) {
	b.t.Helper()
	b.do(chromedp.Poll[chromedp.Void](fmt.Sprintf(`[...document.querySelectorAll('#history tbody tr')].some(r => r.dataset.kind === %q && r.textContent.includes(%q))`, kind, want),
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
}

// An operation's page shows its history as the audit trail has it, live:
// claimed, the operator's approval with name and reason, the firing, the
// outcome, each checked with the workers' published keys; after a forget,
// the page of the record-less key still shows it, with who forgot it and
// why; a forged event appended to the trail is shown as not verifying.
// An operator of another namespace sees none of it, on the page or from
// the API.
func TestConsoleHistory(t *testing.T) {
	t.Parallel()
	e := newConsoleEnv(t, "")
	g := e.gw
	waiting := g.call(t, agentB, "refund", `{"order_id":"H-1","amount_cents":4200}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, waiting.status, waiting.raw)
	key := ledgerKey(t, waiting.str("key"))

	ops := e.tab(t, operator)
	ops.open("/console/op/" + key)
	ops.do(chromedp.WaitVisible(chromedp.CSS(`#live-status.on`)))
	ops.waitHistory("claimed", "Claimed by w1")
	require.Contains(t, ops.text(`#commands`), "bin/submit audit show "+key)
	require.Contains(t, ops.text(`#commands`), "/v1/operations/"+key+"/history")

	// Approved from the page: the page redraws as the trail grows.
	ops.do(chromedp.SendKeys(chromedp.CSS(`#decide input[name="reason"]`), "receipt checked"),
		chromedp.Click(chromedp.CSS(`#decide button.approve`)),
		chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, ops.text(`#flashes .flash`), "fired once and completed")
	ops.waitHistory("outcome", "Recorded completed")

	rows := ops.history()
	var kinds []string
	for _, r := range rows {
		kinds = append(kinds, r.Kind)
		require.Equal(t, "verified", r.Signature, "every event verifies: %+v", r)
		require.Contains(t, []string{"verified", "unknown"}, r.Link, "%+v", r)
	}
	// The approved firing's claim fires at once, so its fired event
	// records both (docs/audit.md).
	require.Equal(t, []string{"claimed", "outcome", "decision", "fired", "outcome"}, kinds, "in the order they happened")
	require.Contains(t, rows[1].Text, "Recorded awaiting_approval", rows[1].Text)
	decision := rows[2].Text
	require.Contains(t, decision, "Approved by operator "+operator, decision)
	require.Contains(t, decision, "receipt checked", decision)
	require.Contains(t, rows[3].Text, "webhook effect", rows[3].Text)
	require.Contains(t, rows[4].Text, "Recorded completed", rows[4].Text)
	require.Zero(t, ops.count(`#history tr.bad`))
	shot, err := chromedp.Run(ops.ctx, chromedp.Screenshot(chromedp.CSS(`#history`)))
	require.NoError(t, err)
	ops.save("history", shot)

	// The API serves the same events; team-a's operator is refused the
	// history of team-b's operation, by the API and by the console.
	api := g.do(t, http.MethodGet, "/v1/operations/"+key+"/history", operator, "")
	require.Equal(t, http.StatusOK, api.status, api.raw)
	var served struct {
		Entries []json.RawMessage `json:"entries"`
	}
	require.NoError(t, json.Unmarshal([]byte(api.raw), &served))
	require.Len(t, served.Entries, len(rows), "the page shows every event the API serves (and no gap happened)")
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations/"+key+"/history", operatorA, ""), http.StatusNotFound, intent.CodeNotFound)
	other := e.tab(t, operatorA)
	other.open("/console/op/" + key)
	require.Contains(t, other.text(`main`), "No operation")
	require.Zero(t, other.count(`#history`))

	// Forgotten from the page: the record is a forgotten one (who, why),
	// which cannot be forgotten again, and the history goes on. The page
	// is opened afresh first, so that the only message it can show after
	// the click is the forget's (the approval's would match at once).
	ops.open("/console/op/" + key)
	require.Zero(t, ops.count(`#flashes .flash`), "a message is shown once")
	ops.do(chromedp.SendKeys(chromedp.CSS(`#forget-reason`), "customer asked again"),
		chromedp.Click(chromedp.CSS(`#forget button`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, ops.text(`#flashes .flash`), "Forgotten")
	ops.open("/console/op/" + key)
	ops.waitHistory("forgotten", "Forgotten by operator "+operator+": “customer asked again”")
	require.Contains(t, ops.text(`main`), "customer asked again")
	require.Zero(t, ops.count(`#forget`), "a forgotten operation is not offered for forgetting")
	require.Contains(t, ops.text(`#commands`), "bin/submit audit show "+key)
	other.open("/console/op/" + key)
	require.Contains(t, other.text(`main`), "No operation")
	require.Zero(t, other.count(`#history`), "a record-less history of another namespace is not shown either")
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations/"+key+"/history", operatorA, ""), http.StatusNotFound, intent.CodeNotFound)

	// A decision forged into the trail, at the chain's next place but not
	// signed by a worker's key, is shown as not verifying.
	api = g.do(t, http.MethodGet, "/v1/operations/"+key+"/history", operator, "")
	require.Equal(t, http.StatusOK, api.status, api.raw)
	require.NoError(t, json.Unmarshal([]byte(api.raw), &served))
	last := served.Entries[len(served.Entries)-1]
	var entry struct {
		Partition int         `json:"partition"`
		Pos       uint64      `json:"pos"`
		Event     audit.Event `json:"event"`
		Seal      audit.Seal  `json:"seal"`
	}
	require.NoError(t, json.Unmarshal(last, &entry))
	require.Equal(t, "forgotten", string(entry.Event.Kind), "the forget is the partition's last entry: %s", last)
	prev, err := audit.EntryDigest(last)
	require.NoError(t, err)
	forged := fmt.Sprintf(`{"event":{"at":%q,"by":"mallory","key":%q,"kind":"decision","op":"approve","reason":"trust me","v":1},"partition":%d,"pos":%d,"prev":%q,"seal":{"sig":%q,"signer":%q}}`,
		time.Now().UTC().Format(time.RFC3339Nano), entry.Event.Key, entry.Partition, entry.Pos+1, prev, strings.Repeat("A", 86), entry.Seal.Signer)
	nc := connect(t, e.nats)
	require.NoError(t, nc.Publish(fmt.Sprintf("idem.audit.%d", entry.Partition), []byte(forged)))
	require.NoError(t, nc.Flush())
	ops.waitHistory("decision", "mallory")
	forgedRow := ops.history()[len(ops.history())-1]
	require.Equal(t, historyRow{Kind: "decision", Signature: "failed", Link: "verified", Text: forgedRow.Text}, forgedRow)
	require.Contains(t, forgedRow.Text, "does not verify")
	require.Equal(t, 1, ops.count(`#history tr.bad`), "only the forged event")
}
