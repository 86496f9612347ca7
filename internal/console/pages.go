package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/internal/auth"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Bounds of the console's ledger reads.
const (
	// scanPages bounds the listing pages (of up to Config.ListMaxScan
	// records each) one queue or overview read makes; past it the page
	// says the scan stopped.
	scanPages = 50
	// queueShown bounds the operations the queue draws (oldest first); the
	// counts still count every one.
	queueShown = 300
	// deadLettersShown bounds the dead-letter list.
	deadLettersShown = 500
)

// queueStatuses are the states the queue shows: the ones waiting for a
// person.
var queueStatuses = []intent.Status{intent.StatusAwaitingApproval, intent.StatusUncertain}

// scan reads every open record of the ledger (every namespace: the hub's
// view needs them all), at most scanPages pages. complete is false when it
// stopped before the end.
func (c *Console) scan(ctx context.Context) (recs []dedup.Listed, complete bool, err error) {
	q := dedup.Query{Statuses: dedup.OpenStatuses, Limit: dedup.MaxListLimit, MaxScan: c.cfg.ListMaxScan}
	for range scanPages {
		page, err := c.cl.Records(ctx, q)
		if err != nil {
			return recs, false, err
		}
		recs = append(recs, page.Records...)
		if !page.More {
			return recs, true, nil
		}
		q.After = page.Next
	}
	return recs, false, nil
}

// reaching keeps the records tok reaches.
func reaching(tok *auth.Token, recs []dedup.Listed) []dedup.Listed {
	out := recs[:0:0]
	for _, r := range recs {
		if tok.Reaches(r.Session) {
			out = append(out, r)
		}
	}
	return out
}

// item is an operation as the queue and the record page show it.
type item struct {
	Key      string
	Rev      uint64
	Rec      dedup.Record
	Args     string // the arguments, indented JSON; "" when not kept
	CallID   string
	Back     string // where an action returns: queue or record
	CSRF     string
	Changed  bool // the arguments are not the ones the page showed before
	Expired  bool // a pending record's lease has run out
	Takeover int  // claims after the first
	// ProbeKey is the full key to probe the operation by when it is
	// uncertain and its tool has a probe, so the page offers "Probe now";
	// "" otherwise.
	ProbeKey string
}

func newItem(key string, rev uint64, rec dedup.Record, csrf, back string) item {
	it := item{Key: key, Rev: rev, Rec: rec, CSRF: csrf, Back: back, Expired: rec.Status == intent.StatusPending && rec.LeaseExpired(time.Now()),
		Takeover: max(rec.Attempt-1, 0)}
	if len(rec.Intent) > 0 {
		if env, err := intent.Decode(rec.Intent, intent.Limits{MaxBytes: len(rec.Intent) + 1}); err == nil {
			it.Args, it.CallID = indentJSON(env.Args), env.CallID
		}
	}
	return it
}

// indentJSON is raw indented for reading, or raw as it is when it does not
// parse.
func indentJSON(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

// statusCount is one status's count.
type statusCount struct {
	Status intent.Status
	N      int
}

// queueData is the queue page's.
type queueData struct {
	Items    []item
	Hidden   int // operations in the queue beyond queueShown
	Counts   []statusCount
	Complete bool
	Error    string
}

// queueData reads the queue for sess: the operations awaiting a decision,
// oldest first, and the open records counted by status. The hub is started
// first, so that the page's position covers every change after the read.
func (c *Console) queueData(ctx context.Context, sess *consoleSession) (queueData, string) {
	since := c.hub.ensure(ctx)
	recs, complete, err := c.scan(ctx)
	if err != nil {
		return queueData{Error: fmt.Sprintf("The ledger cannot be read: %v", err)}, since
	}
	c.hub.seed(since, recs, complete)
	d := queueData{Complete: complete}
	counts := map[intent.Status]int{}
	var queue []dedup.Listed
	for _, r := range reaching(sess.tok, recs) {
		counts[r.Status]++
		if slices.Contains(queueStatuses, r.Status) {
			queue = append(queue, r)
		}
	}
	for _, s := range dedup.OpenStatuses {
		d.Counts = append(d.Counts, statusCount{Status: s, N: counts[s]})
	}
	slices.SortStableFunc(queue, func(a, b dedup.Listed) int { return a.CreatedAt.Compare(b.CreatedAt) })
	if len(queue) > queueShown {
		d.Hidden = len(queue) - queueShown
		queue = queue[:queueShown]
	}
	for _, r := range queue {
		it := newItem(r.Key, r.Revision, r.Record, sess.csrf, "queue")
		it.ProbeKey = c.probeable(ctx, r.Key, r.Record)
		d.Items = append(d.Items, it)
	}
	return d, since
}

// queue shows the operations waiting for a person, live.
func (c *Console) queue(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	d, since := c.queueData(r.Context(), sess)
	c.renderPage(w, r, sess, http.StatusOK, pageData{Title: "Queue", Nav: "queue", Live: "queue", Since: since, Data: d})
}

// queueItems is the queue's list alone, for a live page that lost track of
// changes (a reconnect, a burst it could not take).
func (c *Console) queueItems(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	d, since := c.queueData(r.Context(), sess)
	w.Header().Set("Idem-Console-Since", since)
	c.fragment(w, "queue-list", d)
}

// queueItem is one operation's entry of the queue, for a live page that saw
// it change; 204 when it is not in the queue (any more) or not the
// operator's.
func (c *Console) queueItem(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	key := r.PathValue("key")
	rec, rev, err := c.cl.GetRevision(r.Context(), key)
	switch {
	case errors.Is(err, client.ErrNotFound), errors.Is(err, intent.ErrInvalid), errors.Is(err, dedup.ErrInvalid),
		err == nil && (!sess.tok.Reaches(rec.Session) || !slices.Contains(queueStatuses, rec.Status)):
		w.WriteHeader(http.StatusNoContent)
		return
	case err != nil:
		http.Error(w, "the ledger cannot be read: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	it := newItem(key, rev, rec, sess.csrf, "queue")
	it.ProbeKey = c.probeable(r.Context(), key, rec)
	c.fragment(w, "queue-item", it)
}

// operation is a record as GET /v1/operations/{key} answers it, which
// the record page shows raw.
type operation struct {
	Key string `json:"key"`
	dedup.Record
}

// forgotten is a forget's answer as DELETE /v1/operations/{key} gives it.
type forgotten struct {
	Forgotten string       `json:"forgotten"`
	Record    dedup.Record `json:"record"`
}

// recordData is the record page's.
type recordData struct {
	item
	Found       bool
	Forgettable bool
	// Unresolved: forgetting it needs "forget anyway" (see forget).
	Unresolved bool
	Error      string
	Result     string
	Raw        string
	Commands   []command
	History    historyData
}

// command is a shell command that does what the page does.
type command struct {
	Label, Text string
}

// record shows everything the ledger knows of one operation, live.
func (c *Console) record(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	key := r.PathValue("key")
	since := c.hub.ensure(r.Context())
	rec, rev, err := c.cl.GetRevision(r.Context(), key)
	p := pageData{Title: "Operation " + key, Nav: "record", Live: "record", Since: since, Key: key}
	d := recordData{item: item{Key: key}}
	status := http.StatusOK
	switch {
	case errors.Is(err, client.ErrNotFound), err == nil && !sess.tok.Reaches(rec.Session):
		status, d.Error = http.StatusNotFound, fmt.Sprintf("No operation %s in the ledger (or not in namespace %s).", key, sess.tok.Namespace)
		// A forgotten or expired operation still has its history.
		if d.History = c.history(r.Context(), sess, key, false); len(d.History.Rows) > 0 {
			status, d.Commands = http.StatusOK, c.commands(r, key, nil, "")
		} else {
			d.History = historyData{}
		}
	case errors.Is(err, intent.ErrInvalid), errors.Is(err, dedup.ErrInvalid):
		status, d.Error, p.Live = http.StatusBadRequest, err.Error(), ""
	case err != nil:
		status, d.Error = http.StatusServiceUnavailable, fmt.Sprintf("The ledger cannot be read: %v", err)
	default:
		d.Found, p.Rev = true, rev
		d.item = newItem(key, rev, rec, sess.csrf, "record")
		d.ProbeKey = c.probeable(r.Context(), key, rec)
		d.Result = indentJSON(rec.Result)
		raw, _ := json.MarshalIndent(operation{Key: key, Record: rec}, "", "  ")
		d.Raw = string(raw)
		d.Commands = c.commands(r, key, &rec, d.ProbeKey)
		d.Forgettable = forgettable(rec)
		d.Unresolved = !rec.Status.Final() && rec.Status != intent.StatusForgotten
		d.History = c.history(r.Context(), sess, key, true)
	}
	p.Data = d
	c.renderPage(w, r, sess, status, p)
}

// probeable returns the key to probe the operation under key by, or "" when
// it may not be probed now: it must be uncertain, its tool must have a
// probe (the catalogue says), and the key the downstream knows must be
// known: key itself when full, or, for a compact ledger key, the one its
// last probe asked about.
func (c *Console) probeable(ctx context.Context, key string, rec dedup.Record) string {
	if rec.Status != intent.StatusUncertain {
		return ""
	}
	full := key
	if intent.CompactLedgerKey(key) {
		if rec.Probe == nil {
			return ""
		}
		if sk, err := intent.LedgerKey(rec.Probe.Key, intent.LayoutCompact); err != nil || sk != key {
			return ""
		}
		full = rec.Probe.Key
	}
	if t, ok, err := c.cl.Tool(ctx, rec.Tool); err != nil || !ok || !t.Probe {
		return ""
	}
	return full
}

// commands are the submit and curl command lines that do what the record
// page shows and its actions do; rec is nil when the key has no record;
// probe is the key to probe it by, "" when it may not be (probeable).
func (c *Console) commands(r *http.Request, key string, rec *dedup.Record, probe string) []command {
	base := c.baseURL(r)
	auth := `-H "Authorization: Bearer $(cat data/operator.token)"`
	post := func(op, body string) string {
		return fmt.Sprintf("curl -sS -X POST %s -H 'Content-Type: application/json' \\\n  -d '%s' \\\n  %s/v1/operations/%s/%s", auth, body, base, key, op)
	}
	history := []command{
		{"Read its history", "bin/submit audit show " + key},
		{"Read its history over HTTP", fmt.Sprintf("curl -sS %s %s/v1/operations/%s/history", auth, base, key)},
	}
	if rec == nil {
		return history
	}
	cmds := append([]command{
		{"Read the record", "bin/submit get " + key},
		{"Read the record over HTTP", fmt.Sprintf("curl -sS %s %s/v1/operations/%s", auth, base, key)},
	}, history...)
	switch rec.Status {
	case intent.StatusAwaitingApproval:
		cmds = append(cmds,
			command{"Approve these arguments", fmt.Sprintf("bin/submit approve %s --fingerprint %s --reason 'REASON'", key, rec.Fingerprint)},
			command{"Approve over HTTP", post("approve", fmt.Sprintf(`{"fingerprint":"%s","reason":"REASON"}`, rec.Fingerprint))},
			command{"Deny", fmt.Sprintf("bin/submit deny %s --reason 'REASON'", key)},
			command{"Deny over HTTP", post("deny", `{"reason":"REASON"}`)})
	case intent.StatusApproved:
		cmds = append(cmds,
			command{"Deny before it fires", fmt.Sprintf("bin/submit deny %s --reason 'REASON'", key)},
			command{"Deny over HTTP", post("deny", `{"reason":"REASON"}`)})
	case intent.StatusUncertain:
		if probe != "" {
			cmds = append(cmds,
				command{"Ask the downstream whether it happened (its tool's probe)", "bin/submit probe " + probe},
				command{"Probe over HTTP", fmt.Sprintf("curl -sS -X POST %s %s/v1/operations/%s/probe", auth, base, probe)})
		}
		cmds = append(cmds,
			command{"Resolve as succeeded", fmt.Sprintf("bin/submit resolve %s --outcome succeeded --result '{\"...\":\"...\"}' --reason 'REASON'", key)},
			command{"Resolve as failed", fmt.Sprintf("bin/submit resolve %s --outcome failed --reason 'REASON'", key)},
			command{"Resolve over HTTP", post("resolve", `{"outcome":"succeeded","result":{},"reason":"REASON"}`)})
	}
	if forgettable(*rec) {
		cmds = append(cmds,
			command{"Forget, so that it may run again", "bin/submit forget " + key},
			command{"Forget over HTTP", fmt.Sprintf("curl -sS -X DELETE %s %s/v1/operations/%s", auth, base, key)})
	}
	return cmds
}

// baseURL is the front door's URL as the browser reaches it.
func (c *Console) baseURL(r *http.Request) string {
	if c.cfg.HTTPS {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// forgettable reports whether a forget of rec would not be refused as in
// flight.
func forgettable(rec dedup.Record) bool {
	switch rec.Status {
	case intent.StatusApproved, intent.StatusForgotten:
		return false
	case intent.StatusPending:
		return rec.LeaseExpired(time.Now())
	}
	return true
}

// act applies an operator action to an operation: approve, deny, resolve,
// probe or forget, through the same client calls as the API and submit, as the
// session's token; the outcome is shown on the page it came from.
func (c *Console) act(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	key, action := r.PathValue("key"), r.PathValue("action")
	back := Path + "op/" + url.PathEscape(key)
	if r.PostFormValue("back") == "queue" {
		back = Path
	}
	link := Path + "op/" + url.PathEscape(key)
	done := func(f flash) {
		switch f.Link {
		case "":
			f.Link = link
		case "-": // the operation is gone
			f.Link = ""
		}
		c.sessions.addFlash(sess, f)
		http.Redirect(w, r, back, http.StatusSeeOther)
	}
	switch action {
	case intent.ControlApprove, intent.ControlDeny, intent.ControlResolve, intent.ControlProbe, "forget":
	default:
		c.errorPage(w, r, sess, http.StatusNotFound, "No such action", fmt.Sprintf("%q is not an action: use approve, deny, resolve, probe or forget.", clip(action)))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), consoleWait)
	defer cancel()
	rec, err := c.cl.Get(ctx, key)
	switch {
	case errors.Is(err, client.ErrNotFound), errors.Is(err, intent.ErrInvalid), errors.Is(err, dedup.ErrInvalid),
		err == nil && !sess.tok.Reaches(rec.Session):
		done(flash{Kind: "error", Text: fmt.Sprintf("No operation %s (in namespace %s): nothing was done.", clip(key), sess.tok.Namespace)})
		return
	case err != nil:
		done(flash{Kind: "error", Text: fmt.Sprintf("The ledger cannot be read, nothing was done: %v", err)})
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if action == "forget" {
		c.forget(ctx, sess, key, reason, r.PostFormValue("force") == "on", done)
		return
	}
	d := intent.Control{Key: key, By: sess.tok.Name, Reason: reason}
	switch action {
	case intent.ControlApprove:
		d.Fingerprint = r.PostFormValue("fingerprint")
		if d.Fingerprint == "" {
			done(flash{Kind: "error", Text: "This form names no fingerprint, so it cannot say which arguments it approves: nothing was approved. Reload the page."})
			return
		}
	case intent.ControlResolve:
		d.Outcome = r.PostFormValue("outcome")
		if d.Outcome != intent.OutcomeSucceeded && d.Outcome != intent.OutcomeFailed {
			done(flash{Kind: "error", Text: "Choose an outcome, succeeded or failed: nothing was resolved."})
			return
		}
		if res := strings.TrimSpace(r.PostFormValue("result")); res != "" {
			if d.Outcome == intent.OutcomeFailed {
				done(flash{Kind: "error", Text: "A failed outcome has no result (its reason is the callers' error message): nothing was resolved."})
				return
			}
			if !json.Valid([]byte(res)) {
				done(flash{Kind: "error", Text: "The result is not valid JSON: nothing was resolved."})
				return
			}
			d.Result = json.RawMessage(res)
		}
	}
	res, err := c.cl.Decide(ctx, action, d)
	switch {
	case errors.Is(err, client.ErrNoAnswer):
		done(flash{Kind: "info", Text: fmt.Sprintf("The %s was sent and no worker answered within %s; the operation's page shows the outcome once it is recorded.", action, consoleWait)})
		return
	case errors.Is(err, intent.ErrInvalid):
		done(flash{Kind: "error", Text: err.Error()})
		return
	case err != nil:
		done(flash{Kind: "error", Text: fmt.Sprintf("The workers cannot be reached: %v", err)})
		return
	}
	detail, _ := json.MarshalIndent(res, "", "  ")
	f := flash{Detail: string(detail)}
	var after *dedup.Record
	if res.Status == intent.StatusRejected && res.Error != nil && res.Error.Code == intent.CodeWrongState {
		// Say what the operation is now and who made it so, not the
		// workers' words.
		if now, err := c.cl.Get(ctx, key); err == nil {
			after = &now
		}
	}
	f.Kind, f.Text = c.decided(action, key, rec, after, res)
	if action == intent.ControlProbe && res.Status != intent.StatusRejected {
		f.Kind, f.Text = c.probed(ctx, key, res)
	}
	done(f)
}

// decided says what a decision's answer means for the operator; before is
// the record as read just before the decision was sent, after as read
// after a refusal for its state (nil: not read).
func (c *Console) decided(action, key string, before dedup.Record, after *dedup.Record, res *intent.Result) (kind, text string) {
	if res.Status == intent.StatusRejected {
		code, msg := "", ""
		if res.Error != nil {
			code, msg = res.Error.Code, res.Error.Message
		}
		switch code {
		case intent.CodeConflict:
			return "error", "Not approved: the operation's arguments are no longer the ones this page showed (another fingerprint). Nothing fired. Read the arguments it has now and decide again."
		case intent.CodeWrongState:
			return "error", refusedFor(action, after, msg)
		case intent.CodeNotFound:
			return "error", fmt.Sprintf("No operation %s: nothing was done.", key)
		}
		return "error", fmt.Sprintf("The %s was refused: %s", action, msg)
	}
	// A decision taken before this one (in another tab, by another
	// operator) is answered with the operation as it is: say so.
	if d := before.Decision; d != nil && d.Op == action && before.Status != intent.StatusAwaitingApproval && before.Status != intent.StatusUncertain {
		return "info", fmt.Sprintf("Already decided: %s by %s at %s. This %s changed nothing and fired nothing; the operation is %s.",
			PastTense(action), d.By, d.At.UTC().Format(time.RFC3339), noun(action), res.Status)
	}
	switch action {
	case intent.ControlApprove:
		switch res.Status {
		case intent.StatusCompleted:
			return "ok", "Approved: the operation fired once and completed. Its callers get this result."
		case intent.StatusFailed:
			return "error", "Approved: the operation fired and failed. Its callers get this error."
		}
		return "info", fmt.Sprintf("Approved: the operation is %s.", res.Status)
	case intent.ControlDeny:
		return "ok", "Denied: it never fires; its callers get error denied with your reason."
	}
	return "ok", fmt.Sprintf("Resolved: the operation is %s; its callers get this outcome.", res.Status)
}

// probed says what a probe's answer means for the operator, with the
// verdict the record now carries.
func (c *Console) probed(ctx context.Context, key string, res *intent.Result) (kind, text string) {
	verdict := "not recorded"
	if rec, err := c.cl.Get(ctx, key); err == nil && rec.Probe != nil {
		verdict = rec.Probe.Verdict
	}
	if res.Status == intent.StatusCompleted {
		return "ok", fmt.Sprintf("Probed: verdict %s. The downstream had done it: the operation is completed with its answer, nothing fired again, and its callers get this result.", verdict)
	}
	return "info", fmt.Sprintf("Probed: verdict %s. The operation is still %s: the page shows the evidence; resolve it once you know what happened.", verdict, res.Status)
}

// refusedFor says why a decision does not apply to the operation: who
// decided it otherwise and when, else the state it is in (after, read once
// refused; nil: the workers' words, msg).
func refusedFor(action string, after *dedup.Record, msg string) string {
	not := "Not " + PastTense(action)
	switch {
	case after == nil:
		return fmt.Sprintf("%s: a %s does not apply to the operation in its state (%s). Nothing changed.", not, action, msg)
	case after.Decision != nil:
		return DecidedOtherwise(action, after)
	}
	return fmt.Sprintf("%s: the operation is %s, and a %s does not apply to it. Nothing changed.", not, StatusLabel(after.Status), action)
}

// DecidedOtherwise says why decision action does not apply to an operation
// an operator decided otherwise (after.Decision is set): who decided it, when
// and why. The console and the HTTP API say it in these words.
func DecidedOtherwise(action string, after *dedup.Record) string {
	d := after.Decision
	why := ""
	if d.Reason != "" {
		why = fmt.Sprintf(" (“%s”)", d.Reason)
	}
	return fmt.Sprintf("Not %s: %s by %s at %s%s; the operation is %s. Nothing changed and nothing fired.",
		PastTense(action), capitalized(PastTense(d.Op)), orElse(d.By, "an operator"), d.At.UTC().Format(time.RFC3339), why, StatusLabel(after.Status))
}

func noun(action string) string {
	switch action {
	case intent.ControlApprove:
		return "approval"
	case intent.ControlDeny:
		return "denial"
	}
	return "resolution"
}

// PastTense is a decision as done: approve is approved.
func PastTense(action string) string {
	switch action {
	case intent.ControlApprove:
		return "approved"
	case intent.ControlDeny:
		return "denied"
	case intent.ControlResolve:
		return "resolved"
	case intent.ControlProbe:
		return "probed"
	case "forget":
		return "forgotten"
	}
	return action
}

// forget deletes an operation's record so that it may run again, as
// DELETE /v1/operations/{key} and submit forget do: the audit trail records
// the session's token name and the reason; an unresolved operation only
// when force (the page's "forget anyway").
func (c *Console) forget(ctx context.Context, sess *consoleSession, key, reason string, force bool, done func(flash)) {
	opts := []client.ForgetOption{client.ForgetBy(sess.tok.Name, reason)}
	if force {
		opts = append(opts, client.Forced())
	}
	rec, err := c.cl.Forget(ctx, key, opts...)
	switch {
	case errors.Is(err, client.ErrInFlight):
		done(flash{Kind: "error", Text: fmt.Sprintf("Refused: the operation may be firing now (%s, lease until %s). Nothing was forgotten.", rec.Status, rec.LeaseUntil.UTC().Format(time.RFC3339))})
	case errors.Is(err, client.ErrUnresolved):
		done(flash{Kind: "error", Text: fmt.Sprintf("Refused: the operation is %s, not settled, and nothing was forgotten. %v", rec.Status, err)})
	case errors.Is(err, client.ErrNotFound):
		done(flash{Kind: "info", Text: fmt.Sprintf("No operation %s (the workers were told to forget it anyway).", key)})
	case err != nil:
		done(flash{Kind: "error", Text: fmt.Sprintf("Not forgotten: %v", err)})
	default:
		detail, _ := json.MarshalIndent(forgotten{Forgotten: key, Record: rec}, "", "  ")
		done(flash{Kind: "ok", Text: fmt.Sprintf("Forgotten: the %s record is deleted and the workers were told; the next call with this key runs again.", rec.Status), Detail: string(detail), Link: "-"})
	}
}

// searchData is the search page's.
type searchData struct {
	Key, Tool, Session, Status, Since, Until string
	Tools                                    []string
	Statuses                                 []intent.Status
	Asked                                    bool
	Results                                  []dedup.Listed
	Next                                     string // the next page's URL
	Error                                    string
}

// search finds operations by key (full or as the ledger stores it), tool,
// session, status and time.
func (c *Console) search(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	v := r.URL.Query()
	d := searchData{Key: strings.TrimSpace(v.Get("key")), Tool: strings.TrimSpace(v.Get("tool")), Session: strings.TrimSpace(v.Get("session")),
		Status: v.Get("status"), Since: strings.TrimSpace(v.Get("since")), Until: strings.TrimSpace(v.Get("until")),
		Statuses: []intent.Status{intent.StatusPending, intent.StatusAwaitingApproval, intent.StatusApproved, intent.StatusUncertain,
			intent.StatusCompleted, intent.StatusFailed, intent.StatusDenied}}
	if cat, err := c.cl.Catalog(r.Context(), client.CatalogFresh); err == nil {
		for _, t := range cat.Tools {
			d.Tools = append(d.Tools, t.Name)
		}
	}
	d.Asked = d.Key != "" || d.Tool != "" || d.Session != "" || d.Status != "" || d.Since != "" || d.Until != "" || v.Has("all")
	render := func(status int) { c.render(w, r, sess, status, "search", d) }
	if d.Key != "" {
		rec, _, err := c.cl.GetRevision(r.Context(), d.Key)
		switch {
		case err == nil && sess.tok.Reaches(rec.Session):
			http.Redirect(w, r, Path+"op/"+url.PathEscape(d.Key), http.StatusSeeOther)
		case err == nil, errors.Is(err, client.ErrNotFound):
			d.Error = fmt.Sprintf("No operation %s (in namespace %s). A key is the full one (tool.digest) or the one a listing shows.", d.Key, sess.tok.Namespace)
			render(http.StatusNotFound)
		default:
			d.Error = err.Error()
			render(http.StatusBadRequest)
		}
		return
	}
	if !d.Asked {
		render(http.StatusOK)
		return
	}
	q := dedup.Query{Tool: d.Tool, Session: d.Session, MaxScan: c.cfg.ListMaxScan}
	var err error
	if q.Statuses, err = dedup.ParseStatuses(d.Status); err != nil {
		d.Error = err.Error()
		render(http.StatusBadRequest)
		return
	}
	now := time.Now()
	var since time.Time
	if d.Since != "" {
		if since, err = pointInTime(d.Since, now); err != nil {
			d.Error = "Created since: " + err.Error()
			render(http.StatusBadRequest)
			return
		}
	}
	if d.Until != "" {
		if q.CreatedBefore, err = pointInTime(d.Until, now); err != nil {
			d.Error = "Created before: " + err.Error()
			render(http.StatusBadRequest)
			return
		}
	}
	if a := v.Get("after"); a != "" {
		if q.After, err = strconv.ParseUint(a, 10, 64); err != nil {
			d.Error = "after: give the cursor of the previous page"
			render(http.StatusBadRequest)
			return
		}
	}
	tok := sess.tok
	q.Match = func(_ string, rec dedup.Record) bool {
		return tok.Reaches(rec.Session) && (since.IsZero() || !rec.CreatedAt.Before(since))
	}
	page, err := c.cl.Records(r.Context(), q)
	if err != nil {
		d.Error = err.Error()
		status := http.StatusServiceUnavailable
		if errors.Is(err, dedup.ErrInvalid) {
			status = http.StatusBadRequest
		}
		render(status)
		return
	}
	d.Results = page.Records
	if page.More {
		next := r.URL.Query()
		next.Set("after", strconv.FormatUint(page.Next, 10))
		d.Next = Path + "search?" + next.Encode()
	}
	render(http.StatusOK)
}

// pointInTime reads an RFC 3339 time, or a duration before now (2h: two
// hours ago).
func pointInTime(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q: give an RFC 3339 time (2025-01-31T09:00:00Z) or a duration ago (90m, 2h)", clip(s))
}

// deadLettersData is the dead-letter pages'.
type deadLettersData struct {
	Letters []client.DeadLetter
	Letter  *client.DeadLetter
	Headers []header
	Data    string
	Key     string // the intent's key, when its headers name one
	Error   string
	CSRF    string
	Base    string // the front door's URL, for the curl command
}

type header struct{ Name, Value string }

// deadLetters lists the dead letters, oldest first. Dead letters carry no
// trusted session, so only an operator of every namespace reads them, as
// in the API.
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	d := deadLettersData{CSRF: sess.csrf}
	if sess.tok.Namespace != auth.AllNamespaces {
		d.Error = fmt.Sprintf("Dead letters carry no trusted session, so they are for operators of every namespace (*); %s's is %s.", sess.tok.Name, sess.tok.Namespace)
		c.render(w, r, sess, http.StatusForbidden, "deadletters", d)
		return
	}
	letters, err := c.cl.DeadLetters(r.Context(), deadLettersShown)
	if err != nil {
		d.Error = fmt.Sprintf("The dead letters cannot be read: %v", err)
	}
	d.Letters = letters
	c.render(w, r, sess, http.StatusOK, "deadletters", d)
}

// deadLetter shows one dead letter: why, its headers and its envelope.
func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	d := deadLettersData{CSRF: sess.csrf}
	if sess.tok.Namespace != auth.AllNamespaces {
		d.Error = fmt.Sprintf("Dead letters are for operators of every namespace (*); %s's is %s.", sess.tok.Name, sess.tok.Namespace)
		c.render(w, r, sess, http.StatusForbidden, "deadletter", d)
		return
	}
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		c.errorPage(w, r, sess, http.StatusNotFound, "No such dead letter", fmt.Sprintf("%q is not a dead letter's number.", clip(r.PathValue("seq"))))
		return
	}
	dl, err := c.cl.DeadLetter(r.Context(), seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		c.errorPage(w, r, sess, http.StatusNotFound, "No such dead letter", fmt.Sprintf("Dead letter %d is not in the dead-letter stream (replayed, or never there).", seq))
		return
	case err != nil:
		c.errorPage(w, r, sess, http.StatusServiceUnavailable, "Dead letters unreadable", err.Error())
		return
	}
	d.Letter = &dl
	for name, vs := range dl.Headers {
		for _, v := range vs {
			d.Headers = append(d.Headers, header{name, v})
		}
	}
	slices.SortFunc(d.Headers, func(a, b header) int { return strings.Compare(a.Name, b.Name) })
	d.Key, d.Base = dl.Headers.Get(intent.HeaderKey), c.baseURL(r)
	if len(dl.Data) > 0 {
		d.Data = indentJSON(dl.Data)
	} else {
		d.Data = dl.Raw
	}
	c.render(w, r, sess, http.StatusOK, "deadletter", d)
}

// replay publishes a dead letter again, as POST
// /v1/dead-letters/{seq}/replay and submit dlq replay do: the ledger
// decides whether it fires.
func (c *Console) replay(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	if sess.tok.Namespace != auth.AllNamespaces {
		c.errorPage(w, r, sess, http.StatusForbidden, "Not allowed", "Dead letters are for operators of every namespace (*).")
		return
	}
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		c.errorPage(w, r, sess, http.StatusNotFound, "No such dead letter", fmt.Sprintf("%q is not a dead letter's number.", clip(r.PathValue("seq"))))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), consoleWait)
	defer cancel()
	var key string
	if dl, err := c.cl.DeadLetter(ctx, seq); err == nil {
		key = dl.Headers.Get(intent.HeaderKey)
	}
	newSeq, err := c.cl.ReplayDeadLetter(ctx, seq)
	f := flash{Kind: "ok", Text: fmt.Sprintf("Dead letter %d was published again (intent %d) and left the dead letters. The ledger decides whether it fires: an operation that already ran is answered from its record.", seq, newSeq)}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		f = flash{Kind: "error", Text: fmt.Sprintf("No dead letter %d (replayed already?): nothing was published.", seq)}
	case err != nil:
		f = flash{Kind: "error", Text: fmt.Sprintf("Dead letter %d: %v", seq, err)}
	case key != "":
		f.Link = Path + "op/" + url.PathEscape(key)
	}
	c.sessions.addFlash(sess, f)
	http.Redirect(w, r, Path+"dead-letters", http.StatusSeeOther)
}
