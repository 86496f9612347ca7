package integration

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// A tab drawn before another operator denied the operation approves it:
// nothing fires, and the page says who denied it, when and why, not the
// workers' words. Decisions that change nothing — approving a completed
// operation again, denying a denied one again — are answered, and the
// audit trail records no second decision for them.
func TestConsoleStaleDecisions(t *testing.T) {
	t.Parallel()
	e := newConsoleEnv(t, "")
	g := e.gw
	denied := g.call(t, agentA, "refund", `{"order_id":"S-1","amount_cents":700}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, denied.status, denied.raw)
	key := ledgerKey(t, denied.str("key"))

	stale := e.tab(t, operator)
	stale.blockEvents()
	stale.open("/console/")
	stale.do(chromedp.WaitVisible(chromedp.CSS(item(key))))

	deny := g.do(t, http.MethodPost, "/v1/operations/"+key+"/deny", operatorA, `{"reason":"not this customer"}`)
	require.Equal(t, http.StatusOK, deny.status, deny.raw)
	require.Equal(t, "denied", deny.str("status"), deny.raw)

	stale.do(chromedp.Click(chromedp.CSS(item(key)+` button.approve`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	said := stale.text(`#flashes .flash`)
	require.Contains(t, said, "Not approved: Denied by "+operatorA+" at ", said)
	require.Regexp(t, regexp.MustCompile(` at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`), said, "when")
	require.Contains(t, said, "“not this customer”", said)
	require.Contains(t, said, "Nothing changed and nothing fired", said)
	require.NotContains(t, said, "dedup:", "not the ledger's error text")
	require.NotContains(t, said, "does not apply to the record", said)
	require.Zero(t, e.sink.requests(t), "nothing fired")

	// Denied again: answered, no second decision.
	again := g.do(t, http.MethodPost, "/v1/operations/"+key+"/deny", operator, `{"reason":"twice"}`)
	require.Equal(t, http.StatusOK, again.status, again.raw)

	// Approved, fired, then approved again.
	done := g.call(t, agentB, "refund", `{"order_id":"S-2","amount_cents":800}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, done.status, done.raw)
	dkey := ledgerKey(t, done.str("key"))
	first := g.do(t, http.MethodPost, "/v1/operations/"+dkey+"/approve", operator, `{"reason":"checked"}`)
	require.Equal(t, "completed", first.str("status"), first.raw)
	second := g.do(t, http.MethodPost, "/v1/operations/"+dkey+"/approve", operator, `{"reason":"checked again"}`)
	require.Equal(t, http.StatusOK, second.status, second.raw)
	require.Equal(t, "completed", second.str("status"), second.raw)
	require.Equal(t, 1, e.sink.requests(t), "fired once")

	// The trail is written just after the answers: forgetting each
	// operation appends one more event after theirs, so once it shows,
	// every decision event is in.
	decisions := func(key string) []string {
		forget := g.do(t, http.MethodDelete, "/v1/operations/"+key, operator, "")
		require.Equal(t, http.StatusOK, forget.status, forget.raw)
		for {
			api := g.do(t, http.MethodGet, "/v1/operations/"+key+"/history", operator, "")
			require.Equal(t, http.StatusOK, api.status, api.raw)
			var served struct {
				Entries []struct {
					Event struct {
						Kind, Op, Reason string
					} `json:"event"`
				} `json:"entries"`
			}
			require.NoError(t, json.Unmarshal([]byte(api.raw), &served))
			var ops []string
			forgotten := false
			for _, en := range served.Entries {
				switch en.Event.Kind {
				case "decision":
					ops = append(ops, en.Event.Op+" "+en.Event.Reason)
				case "forgotten":
					forgotten = true
				}
			}
			if forgotten {
				return ops
			}
			select {
			case <-t.Context().Done():
				t.Fatalf("the forget of %s never reached its history: %s", key, api.raw)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	require.Equal(t, []string{"deny not this customer"}, decisions(key), "a denial that changed nothing is no decision")
	require.Equal(t, []string{"approve checked"}, decisions(dkey), "an approval that changed nothing is no decision")
}
