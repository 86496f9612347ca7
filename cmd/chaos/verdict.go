package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Fault kinds.
const (
	faultWorkerKill   = "worker_kill"       // a worker SIGKILLed (and restarted)
	faultJetStream    = "jetstream_restart" // the JetStream process SIGKILLed and restarted on its store
	faultNode         = "node_restart"      // one cluster node SIGKILLed and restarted on its store
	faultHang         = "effect_hang"       // a sink request that hung past the lease
	faultSink5xx      = "sink_5xx"          // a sink request answered 503
	faultSinkAbandon  = "sink_abandoned"    // a hanging request whose caller went away (killed worker)
	crashWindowSlack  = 100 * time.Millisecond
	exampleRepeatsMax = 20
)

// event is one injected process fault; an outage lasts from At to Until.
type event struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"`
	At     time.Time `json:"at"`
	Until  time.Time `json:"until"`
}

// request is one line of the sink's log.
type request struct {
	Time    time.Time       `json:"time"`     // answered
	Arrived time.Time       `json:"received"` // arrived
	Key     string          `json:"key"`
	Status  int             `json:"status"`
	Hung    bool            `json:"hung"`
	Payload json.RawMessage `json:"payload"`
	op      string
}

func (r request) ok() bool { return r.Status >= 200 && r.Status < 300 }

// readSinkLog reads the sink's JSON lines.
func readSinkLog(path string) ([]request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSinkLog(f)
}

func parseSinkLog(r io.Reader) ([]request, error) {
	var out []request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for n := 1; sc.Scan(); n++ {
		var q request
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			return nil, fmt.Errorf("sink log line %d: %w", n, err)
		}
		var p struct {
			Op string `json:"op"`
		}
		_ = json.Unmarshal(q.Payload, &p)
		q.op = p.Op
		out = append(out, q)
	}
	return out, sc.Err()
}

// Repeat is an operation the sink saw succeed more than once.
type Repeat struct {
	Op       string      `json:"op"`
	Key      string      `json:"key"`
	Firings  int         `json:"firings"`
	SameKey  bool        `json:"same_key"`
	Cause    string      `json:"cause"` // worker_kill, ledger_outage or unexplained
	Times    []time.Time `json:"times"` // when each firing's request arrived
	Requests int         `json:"requests"`
}

// Verdict is what a run showed. Every count is over the whole run.
type Verdict struct {
	Mode             string         `json:"mode"`
	Seed             uint64         `json:"seed"`
	LedgerBatch      int            `json:"ledger_batch"` // the workers' --ledger-batch; 0: off
	DurationSeconds  float64        `json:"duration_seconds"`
	IntentsPublished int            `json:"intents_published"`
	UniqueOperations int            `json:"unique_operations"`
	DuplicatesByKind map[string]int `json:"duplicates_injected_by_kind"`
	Duplicates       int            `json:"duplicates_injected"`
	DuplicateShare   float64        `json:"duplicate_share"`
	PublishDuplicate int            `json:"publishes_deduplicated"`
	DelayedDeduped   int            `json:"delayed_copies_deduplicated"` // at most 1% of the delayed copies: they are sent after the window
	PublishRetries   int            `json:"publish_retries"`
	PublishErrors    map[string]int `json:"publish_errors_retried"`
	PublishFailed    int            `json:"copies_never_published"`
	FaultsByKind     map[string]int `json:"faults_injected_by_kind"`
	WorkerCrashes    int            `json:"worker_unexpected_exits"` // e.g. started while JetStream was down
	LeaseTakeovers   int            `json:"lease_takeovers"`
	LiveLeaseLosses  int            `json:"live_holders_that_lost_their_lease"`

	AnswersByRoute  map[string]int `json:"answers_by_route"` // answer, reply, ledger, settle
	ResultsReceived int            `json:"results_received"` // copies answered during the load
	SettledByLedger int            `json:"settled_from_ledger"`
	Unanswered      int            `json:"unanswered_copies"`
	LedgerNotFinal  map[string]int `json:"ledger_not_final"`

	SinkRequests      int `json:"sink_requests"`
	EffectsObserved   int `json:"effects_observed"` // 2xx requests
	OperationsFired   int `json:"operations_fired"`
	LostOperations    int `json:"lost_operations"`               // no firing and no answer at all
	NeverFired        int `json:"operations_answered_not_fired"` // no firing, answered failed, conflict, …
	CompletedNotFired int `json:"completed_without_firing"`
	FiredMoreThanOnce int `json:"operations_fired_more_than_once"`
	ExtraFirings      int `json:"extra_firings"`
	RepeatsCrash      int `json:"repeats_in_crash_window"`
	RepeatsOutage     int `json:"repeats_after_ledger_outage"`
	RepeatsOtherKey   int `json:"repeats_with_other_keys"`
	RepeatsUnexplain  int `json:"repeats_unexplained"`
	RepeatsPhantom    int `json:"repeats_after_phantom_lease_loss"` // the holder was told its lease was lost before anyone took it over
	KeyMismatches     int `json:"requests_with_wrong_key"`
	ForeignRequests   int `json:"requests_of_no_operation"`

	DisagreeingAnswers int            `json:"disagreeing_answers"`
	UnexpectedAnswers  map[string]int `json:"unexpected_answers"` // status/code → copies

	Repeats    []Repeat `json:"repeat_examples,omitempty"` // the least explained first
	repeats    []Repeat // all of them
	Violations []string `json:"violations"`
	OK         bool     `json:"ok"`
}

// judge reconciles the copies' answers with the sink's requests and the
// injected faults.
//
// leases is what the worker logs say: a repeat whose holder logged that it
// lost its lease while alive is not the crash window, and one whose holder
// was told so before anyone took over is a lease lost to its own write.
func judge(v *Verdict, ops []*op, reqs []request, events []event, leases leaseLog, allowOutage bool) {
	v.DuplicatesByKind = map[string]int{}
	v.AnswersByRoute = map[string]int{}
	v.UnexpectedAnswers = map[string]int{}
	if v.FaultsByKind == nil {
		v.FaultsByKind = map[string]int{}
	}
	for _, e := range events {
		v.FaultsByKind[e.Kind]++
	}
	byOp := map[string][]request{}
	for _, q := range reqs {
		v.SinkRequests++
		switch {
		case q.ok():
			v.EffectsObserved++
		case q.Status == 499:
			v.FaultsByKind[faultSinkAbandon]++
		case q.Status >= 500:
			v.FaultsByKind[faultSink5xx]++
		}
		if q.Hung {
			v.FaultsByKind[faultHang]++
		}
		byOp[q.op] = append(byOp[q.op], q)
	}
	known := map[string]bool{}
	for _, o := range ops {
		known[o.id] = true
		var published, answered int
		completed := map[string]bool{}
		for _, c := range o.copies {
			if !c.Published {
				v.PublishFailed++
				continue
			}
			published++
			switch {
			case c.Status == "":
				v.Unanswered++
			case c.Status == intent.StatusCompleted:
				answered++
				completed[string(c.Result)] = true
			default:
				answered++
				v.UnexpectedAnswers[string(c.Status)+"/"+c.Code]++
			}
			if c.Via != "" {
				v.AnswersByRoute[c.Via]++
			}
		}
		if published == 0 {
			continue
		}
		if o.kind == kindDelayed && len(o.copies) > 1 && o.copies[1].Duplicate {
			v.DelayedDeduped++
		}
		v.UniqueOperations++
		v.IntentsPublished += published
		if published > 1 {
			v.DuplicatesByKind[o.kind] += published - 1
			v.Duplicates += published - 1
		}
		if len(completed) > 1 {
			v.DisagreeingAnswers++
		}

		qs := byOp[o.id]
		var fired []request
		for _, q := range qs {
			if q.Key != o.key {
				v.KeyMismatches++
			}
			if q.ok() {
				fired = append(fired, q)
			}
		}
		switch {
		case len(fired) == 0 && answered == 0:
			v.LostOperations++
		case len(fired) == 0 && len(completed) == 0:
			v.NeverFired++ // answered otherwise (failed, conflict…): in unexpected_answers
		case len(fired) == 0:
			v.CompletedNotFired++
		default:
			v.OperationsFired++
		}
		if len(fired) > 1 {
			v.FiredMoreThanOnce++
			v.ExtraFirings += len(fired) - 1
			r := Repeat{Op: o.id, Key: o.key, Firings: len(fired), Requests: len(qs), SameKey: true}
			for _, q := range qs {
				if q.Key != o.key {
					r.SameKey = false
				}
			}
			for _, q := range fired {
				r.Times = append(r.Times, q.Arrived)
			}
			r.Cause = cause(qs, fired, events, leases.live(o.key))
			if leases.phantom(o.key) {
				r.Cause = "phantom_lease_loss"
			}
			switch {
			case !r.SameKey:
				v.RepeatsOtherKey++
			case r.Cause == "phantom_lease_loss":
				v.RepeatsPhantom++
			case r.Cause == faultWorkerKill:
				v.RepeatsCrash++
			case r.Cause == "ledger_outage":
				v.RepeatsOutage++
			default:
				v.RepeatsUnexplain++
			}
			v.repeats = append(v.repeats, r)
		}
	}
	for op, qs := range byOp {
		if !known[op] {
			v.ForeignRequests += len(qs)
		}
	}
	rank := func(r Repeat) int {
		switch {
		case !r.SameKey:
			return 0
		case r.Cause == "unexplained", r.Cause == "phantom_lease_loss":
			return 1
		case r.Cause == "ledger_outage":
			return 2
		}
		return 3
	}
	slices.SortStableFunc(v.repeats, func(a, b Repeat) int { return rank(a) - rank(b) })
	v.Repeats = v.repeats[:min(len(v.repeats), exampleRepeatsMax)]
	v.ResultsReceived = v.AnswersByRoute["answer"] + v.AnswersByRoute["reply"] + v.AnswersByRoute["ledger"]
	v.SettledByLedger = v.AnswersByRoute["settle"]
	if v.IntentsPublished > 0 {
		v.DuplicateShare = float64(v.Duplicates) / float64(v.IntentsPublished)
	}
	v.Violations = violations(v, allowOutage)
	v.OK = len(v.Violations) == 0
}

// cause explains why an operation fired again: a worker was killed, or the
// ledger was unreachable, between the arrival of the operation's first
// request (a holder was acting: a failed attempt is retried by the same
// holder) and the arrival of its second firing (another holder acted, or the
// first went on after losing its lease). Only a fault inside that window lets
// a second firing happen before the first outcome was recorded. A worker kill
// explains it only when the holder did not survive to report its lease lost
// (liveHolder).
func cause(all, fired []request, events []event, liveHolder bool) string {
	byArrival := slices.Clone(fired)
	slices.SortFunc(byArrival, func(a, b request) int { return a.Arrived.Compare(b.Arrived) })
	from, to := byArrival[0].Arrived, byArrival[1].Arrived
	for _, q := range all {
		if q.Arrived.Before(from) {
			from = q.Arrived
		}
	}
	from = from.Add(-crashWindowSlack)
	outage := false
	for _, e := range events {
		until := e.Until
		if until.IsZero() {
			until = e.At
		}
		if e.At.After(to) || until.Before(from) {
			continue
		}
		switch {
		case e.Kind != faultWorkerKill:
			outage = true
		case !liveHolder:
			return faultWorkerKill
		}
	}
	if outage {
		return "ledger_outage"
	}
	return "unexplained"
}

// violations lists what the verdict must not show.
func violations(v *Verdict, allowOutage bool) []string {
	out := []string{}
	add := func(ok bool, format string, a ...any) {
		if !ok {
			out = append(out, fmt.Sprintf(format, a...))
		}
	}
	add(v.UniqueOperations > 0, "no operation was published")
	// A delayed copy is sent a window after its original (and after the last
	// server restart); a server restarted mid-load may still keep an entry a
	// little longer (docs/reliability.md, finding 5). More than 1% means the
	// load does not test what it says.
	add(v.DelayedDeduped*100 <= v.DuplicatesByKind["delayed"], "%d of %d delayed copies were still inside the publish-dedup window: the load is wrong",
		v.DelayedDeduped, v.DuplicatesByKind["delayed"])
	add(v.LostOperations == 0, "%d operations lost (no answer and no firing)", v.LostOperations)
	add(v.NeverFired == 0, "%d operations never fired and were answered otherwise than completed", v.NeverFired)
	add(v.Unanswered == 0, "%d copies without an answer and without a final ledger record", v.Unanswered)
	add(len(v.LedgerNotFinal) == 0, "ledger records not final: %v", v.LedgerNotFinal)
	add(v.CompletedNotFired == 0, "%d operations answered completed but never seen by the sink", v.CompletedNotFired)
	add(v.OperationsFired == v.UniqueOperations, "%d of %d operations fired", v.OperationsFired, v.UniqueOperations)
	add(v.DisagreeingAnswers == 0, "%d operations got disagreeing completed answers", v.DisagreeingAnswers)
	add(len(v.UnexpectedAnswers) == 0, "unexpected answers: %v", v.UnexpectedAnswers)
	add(v.KeyMismatches == 0, "%d sink requests did not carry their operation's key", v.KeyMismatches)
	add(v.ForeignRequests == 0, "%d sink requests belong to no operation", v.ForeignRequests)
	add(v.RepeatsOtherKey == 0, "%d repeated operations carried another Idempotency-Key", v.RepeatsOtherKey)
	add(v.RepeatsUnexplain == 0, "%d operations fired more than once with no crash or ledger outage in between", v.RepeatsUnexplain)
	add(v.RepeatsPhantom == 0, "%d operations fired again after their live holder was told its lease was lost before anyone took it over", v.RepeatsPhantom)
	add(allowOutage || v.RepeatsOutage == 0, "%d operations fired again because their live holder's lease ran out while JetStream was unreachable", v.RepeatsOutage)
	add(v.FiredMoreThanOnce == 0 || v.FaultsByKind[faultWorkerKill]+v.FaultsByKind[faultJetStream]+v.FaultsByKind[faultNode] > 0,
		"%d operations fired more than once in a run without process faults", v.FiredMoreThanOnce)
	return out
}

// print writes the verdict for people.
func (v *Verdict) print(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("chaos verdict (%s, seed %d, ledger batch %d, %.0fs)", v.Mode, v.Seed, v.LedgerBatch, v.DurationSeconds)
	p("  intents published            %d", v.IntentsPublished)
	p("  unique operations            %d", v.UniqueOperations)
	p("  duplicates injected          %d (%.1f%% of intents) %s", v.Duplicates, 100*v.DuplicateShare, sortedMap(v.DuplicatesByKind))
	p("  publishes deduplicated       %d (delayed copies among them: %d)", v.PublishDuplicate, v.DelayedDeduped)
	p("  publish retries              %d (copies never published: %d) %s", v.PublishRetries, v.PublishFailed, sortedMap(v.PublishErrors))
	p("  faults injected              %s", sortedMap(v.FaultsByKind))
	p("  lease takeovers              %d (live holders that lost their lease: %d; worker exits not injected: %d)",
		v.LeaseTakeovers, v.LiveLeaseLosses, v.WorkerCrashes)
	p("  results received             %d %s", v.ResultsReceived, sortedMap(v.AnswersByRoute))
	p("  settled from the ledger      %d", v.SettledByLedger)
	p("  unanswered copies            %d", v.Unanswered)
	p("  sink requests                %d", v.SinkRequests)
	p("  effects observed (2xx)       %d", v.EffectsObserved)
	p("  operations fired             %d", v.OperationsFired)
	p("  lost operations              %d (never fired, answered otherwise: %d)", v.LostOperations, v.NeverFired)
	p("  fired more than once         %d (extra firings %d: crash window %d, ledger outage %d, phantom lease loss %d, other key %d, unexplained %d)",
		v.FiredMoreThanOnce, v.ExtraFirings, v.RepeatsCrash, v.RepeatsOutage, v.RepeatsPhantom, v.RepeatsOtherKey, v.RepeatsUnexplain)
	p("  disagreeing answers          %d", v.DisagreeingAnswers)
	p("  unexpected answers           %s", sortedMap(v.UnexpectedAnswers))
	for _, r := range v.Repeats {
		p("  repeat: %s fired %d times, same key %t, cause %s", r.Op, r.Firings, r.SameKey, r.Cause)
	}
	if v.OK {
		p("OK: nothing lost, nothing fired twice outside the crash window")
		return
	}
	p("VIOLATIONS:")
	for _, s := range v.Violations {
		p("  - %s", s)
	}
}

func sortedMap(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// leaseLog is what the worker logs say about the leases of each key.
type leaseLog struct {
	lost     map[string]time.Time // first "lease lost" of a live holder
	cutOff   map[string]time.Time // first "ledger unreachable past the lease deadline" of a live holder
	takeover map[string]time.Time // first "lease taken over"
}

// live reports whether key's holder logged, alive, that it gave the lease
// up: told it was lost, or cut off from the ledger past its deadline.
func (l leaseLog) live(key string) bool {
	_, lost := l.lost[key]
	_, cut := l.cutOff[key]
	return lost || cut
}

// phantom reports whether key's live holder was told it lost its lease
// before anyone took the lease over: its own write moved the revision.
func (l leaseLog) phantom(key string) bool {
	lost, ok := l.lost[key]
	if !ok {
		return false
	}
	took, ok := l.takeover[key]
	return !ok || lost.Before(took)
}

// readLeaseLog reads worker logs (JSON lines).
func readLeaseLog(paths []string) leaseLog {
	out := leaseLog{lost: map[string]time.Time{}, cutOff: map[string]time.Time{}, takeover: map[string]time.Time{}}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<22)
		for sc.Scan() {
			var m map[string]time.Time
			switch text := sc.Text(); {
			case strings.Contains(text, "lease lost"):
				m = out.lost
			case strings.Contains(text, "ledger unreachable past the lease deadline"):
				m = out.cutOff
			case strings.Contains(text, "lease taken over"):
				m = out.takeover
			default:
				continue
			}
			var line struct {
				TS  float64 `json:"ts"`
				Key string  `json:"key"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil || line.Key == "" {
				continue
			}
			t := time.Unix(0, int64(line.TS*1e9))
			if old, ok := m[line.Key]; !ok || t.Before(old) {
				m[line.Key] = t
			}
		}
		f.Close()
	}
	return out
}
