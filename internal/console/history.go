package console

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/audit"
)

// historyData is the record page's History section: the operation's audit
// events, checked with the keys the workers published, as submit audit
// verify checks a trail.
type historyData struct {
	Rows  []historyRow
	Error string
}

// historyRow is one event of a history, or a gap of its partition.
type historyRow struct {
	At       time.Time
	Kind     string // the event's kind, as the trail names it
	Label    string // the kind for people
	Text     string // what happened
	Gap      bool
	Sig      audit.Check
	SigText  string // the signer, or why it does not verify
	Link     audit.Check
	LinkText string
	Place    string // partition and position
}

// Bad reports whether the event does not verify.
func (r historyRow) Bad() bool { return r.Sig == audit.CheckFailed || r.Link == audit.CheckFailed }

// history reads and checks key's audit trail. reached says the operator's
// namespace holds the operation's record; without one (forgotten,
// expired), the history is shown when its events name sessions of the
// operator's namespace only, as GET /v1/operations/{key}/history decides.
// It has no rows when the trail holds no event of key the operator may
// see.
func (c *Console) history(ctx context.Context, sess *consoleSession, key string, reached bool) historyData {
	keys, err := c.cl.PublishedKeys(ctx)
	if err != nil {
		return historyData{Error: fmt.Sprintf("The workers' public keys cannot be read, so the history is not shown: %v", err)}
	}
	entries, err := c.cl.CheckedHistory(ctx, key, time.Time{}, keys)
	if err != nil {
		return historyData{Error: fmt.Sprintf("The audit trail cannot be read: %v", err)}
	}
	var own [][]byte
	for _, e := range entries {
		if e.Event.Kind != audit.KindGap {
			own = append(own, e.Line)
		}
	}
	if len(own) == 0 || (!reached && !sess.tok.ReachesHistory(own)) {
		return historyData{}
	}
	d := historyData{Rows: make([]historyRow, 0, len(entries))}
	for _, e := range entries {
		d.Rows = append(d.Rows, newHistoryRow(e))
	}
	return d
}

func newHistoryRow(e audit.Checked) historyRow {
	ev := e.Event
	r := historyRow{At: ev.At, Kind: string(ev.Kind), Sig: e.Signature, Link: e.Link, Gap: ev.Kind == audit.KindGap}
	r.Label, r.Text = describeEvent(ev)
	switch e.Signature {
	case audit.CheckVerified:
		r.SigText = "key " + e.Signer
	default:
		r.SigText = e.SignatureDetail
	}
	switch e.Link {
	case audit.CheckVerified:
		r.LinkText = "linked to the entry before it"
	default:
		r.LinkText = e.LinkDetail
	}
	if e.Partition >= 0 {
		r.Place = fmt.Sprintf("partition %d, position %d", e.Partition, e.Pos)
	}
	return r
}

// describeEvent says what an event records: a label for its kind and a
// sentence naming the holder, attempt, destination, operator and reason
// it carries.
func describeEvent(ev audit.Event) (label, text string) {
	var b strings.Builder
	say := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	claim := func() {
		if ev.Attempt > 0 {
			say(" (claim %d)", ev.Attempt)
		}
	}
	why := func() {
		if ev.Reason != "" {
			say(": “%s”", ev.Reason)
		}
	}
	switch ev.Kind {
	case audit.KindClaimed:
		label = "claimed"
		say("Claimed by %s", orElse(ev.Holder, "a worker"))
		claim()
		if ev.IntentSeq > 0 {
			say(", intent %d", ev.IntentSeq)
		}
	case audit.KindTakeover:
		label = "takeover"
		say("Taken over by %s from %s", orElse(ev.Holder, "a worker"), orElse(ev.PreviousHolder, "a holder"))
		if ev.PreviousAttempt > 0 {
			say(" (claim %d)", ev.PreviousAttempt)
		}
		claim()
		switch ev.Reason {
		case audit.ReasonConfirmedAbandoned:
			say(": its lease ran out and the record stayed unchanged for a further lease")
		case audit.ReasonLeaseExpired:
			say(": its lease ran out")
		default:
			why()
		}
	case audit.KindFired:
		label = "fired"
		say("Fired by %s", orElse(ev.Holder, "a worker"))
		claim()
		if ev.Effect != "" {
			say(": %s effect", ev.Effect)
		}
		if ev.Destination != "" {
			say(" to %s", ev.Destination)
		}
		if ev.ForwardedKey != "" {
			say(", forwarded as %s", ev.ForwardedKey)
		}
	case audit.KindReleased:
		label = "released"
		say("Released by %s after a transient failure", orElse(ev.Holder, "a worker"))
		if ev.ErrorCode != "" {
			say(" (%s)", ev.ErrorCode)
		}
		say(", for a retry; %d effect invocations so far", ev.Attempts)
	case audit.KindOutcome:
		label = "outcome"
		say("Recorded %s", orElse(string(ev.Status), "an outcome"))
		if ev.Holder != "" {
			say(" by %s", ev.Holder)
		}
		switch {
		case ev.Attempts == 1:
			say(" after 1 effect invocation")
		case ev.Attempts > 1:
			say(" after %d effect invocations", ev.Attempts)
		}
		if ev.ErrorCode != "" {
			say(", error %s", ev.ErrorCode)
		}
		if ev.By != "" {
			say("; %s by operator %s", PastTense(orElse(ev.Op, "decided")), ev.By)
			why()
		}
	case audit.KindConflict:
		label = "conflict refused"
		say("Refused a call with other arguments (fingerprint %s, the operation's %s): nothing fired", shortDigest(ev.Fingerprint), shortDigest(ev.RecordFingerprint))
	case audit.KindDecision:
		label = "operator decision"
		say("%s by operator %s", capitalized(PastTense(orElse(ev.Op, "decided"))), orElse(ev.By, "(unnamed)"))
		why()
		if ev.Status != "" {
			say("; the operation is %s", ev.Status)
		}
	case audit.KindForgotten:
		label = "forgotten"
		say("Forgotten by operator %s", orElse(ev.By, "(unnamed)"))
		why()
		say(": its record was replaced by a forgotten one, so that it may run again")
	case audit.KindProbed:
		label = "probed"
		say("Probed by %s", orElse(ev.Holder, "a worker"))
		claim()
		if ev.Effect != "" {
			say(", with the %s effect's probe", ev.Effect)
		}
		say(": the downstream answered %s", verdictText(orElse(ev.Reason, "nothing recorded")))
		if ev.Destination != "" {
			say("; asked %s", ev.Destination)
		}
	case audit.KindGap:
		label = "gap"
		say("%s dropped %d events of this partition between %s and %s: events of this operation among them are missing from its history",
			orElse(ev.Holder, "A worker"), ev.Dropped, ev.From.UTC().Format(time.RFC3339), ev.To.UTC().Format(time.RFC3339))
	case "":
		label = "unreadable"
		say("An entry naming this operation that is not an event")
	default:
		label = string(ev.Kind)
		say("An event of a kind this version does not describe")
		if ev.Holder != "" {
			say(", by %s", ev.Holder)
		}
	}
	return label, b.String()
}

func orElse(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func capitalized(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func shortDigest(s string) string {
	if len(s) > 12 {
		return s[:12] + "…"
	}
	return s
}
