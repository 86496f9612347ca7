package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Fault kinds.
const (
	faultWorkerKill    = "worker_kill"       // a worker SIGKILLed (and restarted as a new holder)
	faultJetStream     = "jetstream_restart" // the JetStream process SIGKILLed and restarted on its store
	faultNode          = "node_restart"      // one cluster node SIGKILLed and restarted on its store
	faultLedgerOutage  = "ledger_outage"     // JetStream (single) or a quorum of nodes (cluster) down for over a minute
	faultPowerLoss     = "power_loss"        // JetStream (single) or one node SIGKILLed, its store cut back to what the disk holds, restarted
	faultHang          = "effect_hang"       // a sink request that hung past the lease
	faultSink5xx       = "sink_5xx"          // a sink request answered 503
	faultSinkAbandon   = "sink_abandoned"    // a hanging request whose caller went away (killed worker)
	crashWindowSlack   = 100 * time.Millisecond
	exampleRepeatsMax  = 20
	cutOffLine         = "ledger unreachable past the lease deadline"
	gaveUpLine         = "outcome not recorded: the worker stopped"
	leaseLostLine      = "lease lost"
	leaseTakenOverLine = "lease taken over"
)

// Causes of a repeat, from the facts of its two firings.
const (
	causeCrash        = "worker_kill"        // the earlier firing's holder was killed between the two
	causeCutOff       = "ledger_outage"      // the earlier firing's holder, cut off from the ledger, lived on (or gave its outcome up) and another fired again
	causePhantom      = "phantom_lease_loss" // the earlier holder, alive, was told its lease was lost before anyone took it over
	causeSameAttempt  = "same_attempt"       // the later firing's claim number is not higher
	causeUnattributed = "unattributed"       // a firing without holder or attempt
	causeUnexplained  = "unexplained"        // the earlier holder was alive and connected throughout
)

// event is one injected process fault; an outage lasts from At to Until. A
// worker kill's Target is the holder it killed (e.g. w2.3, the third start
// of worker 2).
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
	Tool    string          `json:"tool"`
	Holder  string          `json:"holder"`  // Idem-Holder: the worker that fired
	Attempt int             `json:"attempt"` // Idem-Attempt: its claim number
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
	Tool     string      `json:"tool"`
	Firings  int         `json:"firings"`
	SameKey  bool        `json:"same_key"`
	Cause    string      `json:"cause"`          // the least explained of its firings: worker_kill, ledger_outage, phantom_lease_loss, same_attempt, unattributed, unexplained
	Kill     string      `json:"kill,omitempty"` // the holder whose kill explains it (worker_kill)
	Times    []time.Time `json:"times"`          // when each firing's request arrived
	Holders  []string    `json:"holders"`        // each firing's holder
	Attempts []int       `json:"attempts"`       // each firing's claim number
	Requests int         `json:"requests"`
}

// KillRepeats is what one worker kill explains: its crash-window repeats,
// and how many it could explain at most.
type KillRepeats struct {
	Holder  string    `json:"holder"`
	At      time.Time `json:"at"`
	Repeats int       `json:"repeats"`
	// Bound is what the holder could have had fired and not recorded when
	// it died: per tool, the fewer of its in-flight cap (the worker's
	// --concurrency, or the tool's max_in_flight) and the operations the
	// sink saw it start whose final record is not its own; at most the
	// worker's concurrency in all.
	Bound int `json:"bound"`
	// Unrecorded is the operations the sink saw it start whose final record
	// is not its own.
	Unrecorded int `json:"started_not_recorded"`
}

// ToolCounts is the part of the verdict about one tool.
type ToolCounts struct {
	Operations int `json:"operations"`
	Fired      int `json:"fired"`
	Lost       int `json:"lost"`
	Unanswered int `json:"unanswered_copies"`
	Repeats    int `json:"fired_more_than_once"`
	// CrashRepeats are the operations fired more than once in the crash
	// window of a killed holder.
	CrashRepeats int `json:"repeats_in_crash_window"`
}

// Verdict is what a run showed. Every count is over the whole run.
type Verdict struct {
	Mode        string `json:"mode"`
	Concurrency int    `json:"worker_concurrency"` // intents one worker handles at once
	Seed        uint64 `json:"seed"`
	// Durability is what the run changed of the shipped durability, as the
	// server's configuration, the workers' command lines and their logs
	// show it (empty: the defaults); DurabilityDeclared what the run said
	// it would change. They must agree.
	Durability         []string       `json:"durability"`
	DurabilityDeclared []string       `json:"durability_declared"`
	DurationSeconds    float64        `json:"duration_seconds"`
	IntentsPublished   int            `json:"intents_published"`
	UniqueOperations   int            `json:"unique_operations"`
	DuplicatesByKind   map[string]int `json:"duplicates_injected_by_kind"`
	Duplicates         int            `json:"duplicates_injected"`
	DuplicateShare     float64        `json:"duplicate_share"`
	PublishDuplicate   int            `json:"publishes_deduplicated"`
	DelayedDeduped     int            `json:"delayed_copies_deduplicated"` // at most 1% of the delayed copies: they are sent after the window
	PublishRetries     int            `json:"publish_retries"`
	PublishErrors      map[string]int `json:"publish_errors_retried"`
	PublishFailed      int            `json:"copies_never_published"`
	Republished        int            `json:"publishes_under_retry_rule"` // copies published again (docs/protocol.md 7.2)
	FaultsByKind       map[string]int `json:"faults_injected_by_kind"`
	PowerLoss          *PowerLoss     `json:"power_loss,omitempty"`
	WorkerCrashes      int            `json:"worker_unexpected_exits"` // e.g. started while JetStream was down
	LeaseTakeovers     int            `json:"lease_takeovers"`
	LiveLeaseLosses    int            `json:"live_holders_that_lost_their_lease"`

	AnswersByRoute  map[string]int `json:"answers_by_route"` // answer, reply, ledger, settle
	ResultsReceived int            `json:"results_received"` // copies answered during the load
	SettledByLedger int            `json:"settled_from_ledger"`
	Unanswered      int            `json:"unanswered_copies"`
	LedgerNotFinal  map[string]int `json:"ledger_not_final"`

	SinkRequests      int                   `json:"sink_requests"`
	EffectsObserved   int                   `json:"effects_observed"` // 2xx requests
	OperationsFired   int                   `json:"operations_fired"`
	ByTool            map[string]ToolCounts `json:"by_tool"`
	LostOperations    int                   `json:"lost_operations"`               // no firing and no answer at all
	NeverFired        int                   `json:"operations_answered_not_fired"` // no firing, answered failed, conflict, …
	CompletedNotFired int                   `json:"completed_without_firing"`
	FiredMoreThanOnce int                   `json:"operations_fired_more_than_once"`
	ExtraFirings      int                   `json:"extra_firings"`
	RepeatsCrash      int                   `json:"repeats_in_crash_window"`
	RepeatsOutage     int                   `json:"repeats_after_ledger_outage"`
	RepeatsOtherKey   int                   `json:"repeats_with_other_keys"`
	RepeatsSameAtt    int                   `json:"repeats_with_same_attempt"`
	RepeatsUnexplain  int                   `json:"repeats_unexplained"`
	RepeatsPhantom    int                   `json:"repeats_after_phantom_lease_loss"` // the holder was told its lease was lost before anyone took it over
	KeyMismatches     int                   `json:"requests_with_wrong_key"`
	ForeignRequests   int                   `json:"requests_of_no_operation"`
	Unattributed      int                   `json:"requests_without_holder_or_attempt"`

	CrashPerKill    []KillRepeats `json:"crash_repeats_per_kill"` // the kills that explain a repeat
	CrashMaxPerKill int           `json:"crash_repeats_max_per_kill"`
	CrashMaxBound   int           `json:"crash_repeats_bound_of_that_kill"`
	crashMax        KillRepeats   // the kill with the most

	DisagreeingAnswers int            `json:"disagreeing_answers"`
	UnexpectedAnswers  map[string]int `json:"unexpected_answers"` // status/code → copies

	Repeats    []Repeat `json:"repeat_examples,omitempty"` // the least explained first
	repeats    []Repeat // all of them
	Violations []string `json:"violations"`
	OK         bool     `json:"ok"`
}

// runFacts is what a run is judged from.
type runFacts struct {
	ops    []*op
	reqs   []request
	events []event
	leases leaseLog
	// concurrency is the intents one worker handles at once (--concurrency).
	concurrency int
	// caps are the tools' max_in_flight, for the capped ones.
	caps map[string]int
	// allowOutage accepts repeats explained by a holder's cut-off line.
	allowOutage bool
	// durability is the evidence of the durability the run ran with.
	durability durabilityFacts
	// powerLoss is the power loss (nil: none happened); powerLossWanted
	// says the run was to have one.
	powerLoss       *PowerLoss
	powerLossWanted bool
}

// judge reconciles the copies' answers with the sink's requests, the worker
// logs and the injected faults.
func judge(v *Verdict, f runFacts) {
	v.DuplicatesByKind = map[string]int{}
	v.AnswersByRoute = map[string]int{}
	v.UnexpectedAnswers = map[string]int{}
	v.ByTool = map[string]ToolCounts{}
	if v.FaultsByKind == nil {
		v.FaultsByKind = map[string]int{}
	}
	for _, e := range f.events {
		v.FaultsByKind[e.Kind]++
	}
	byOp := map[string][]request{}
	for _, q := range f.reqs {
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
		if q.Holder == "" || q.Attempt < 1 {
			v.Unattributed++
		}
		byOp[q.op] = append(byOp[q.op], q)
	}
	v.LiveLeaseLosses = f.leases.lostKeys()
	v.Concurrency = f.concurrency
	v.Durability = f.durability.observed()
	if f.powerLoss != nil {
		pl := *f.powerLoss
		judgePowerLoss(&pl, f.ops)
		v.PowerLoss = &pl
	}
	a := attribution{facts: f, perKill: map[int]int{}}
	known := map[string]bool{}
	for _, o := range f.ops {
		known[o.id] = true
		var published, answered, unanswered int
		completed := map[string]bool{}
		for _, c := range o.copies {
			if !c.Published {
				v.PublishFailed++
				continue
			}
			published++
			switch {
			case c.Status == "":
				unanswered++
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
		tc := v.ByTool[o.tool]
		tc.Operations++
		tc.Unanswered += unanswered
		v.Unanswered += unanswered
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
			tc.Lost++
		case len(fired) == 0 && len(completed) == 0:
			v.NeverFired++ // answered otherwise (failed, conflict…): in unexpected_answers
		case len(fired) == 0:
			v.CompletedNotFired++
		default:
			v.OperationsFired++
			tc.Fired++
		}
		if len(fired) > 1 {
			tc.Repeats++
			v.FiredMoreThanOnce++
			v.ExtraFirings += len(fired) - 1
			r := a.repeat(o, qs, fired)
			switch {
			case !r.SameKey:
				v.RepeatsOtherKey++
			case r.Cause == causePhantom:
				v.RepeatsPhantom++
			case r.Cause == causeSameAttempt:
				v.RepeatsSameAtt++
			case r.Cause == causeCrash:
				v.RepeatsCrash++
				tc.CrashRepeats++
			case r.Cause == causeCutOff:
				v.RepeatsOutage++
			default:
				v.RepeatsUnexplain++
			}
			v.repeats = append(v.repeats, r)
		}
		v.ByTool[o.tool] = tc
	}
	for op, qs := range byOp {
		if !known[op] {
			v.ForeignRequests += len(qs)
		}
	}
	a.judgeKills(v, byOp)
	rank := func(r Repeat) int {
		switch {
		case !r.SameKey:
			return 0
		case r.Cause == causeCrash:
			return 3
		case r.Cause == causeCutOff:
			return 2
		}
		return 1
	}
	slices.SortStableFunc(v.repeats, func(a, b Repeat) int { return rank(a) - rank(b) })
	v.Repeats = v.repeats[:min(len(v.repeats), exampleRepeatsMax)]
	v.ResultsReceived = v.AnswersByRoute["answer"] + v.AnswersByRoute["reply"] + v.AnswersByRoute["ledger"]
	v.SettledByLedger = v.AnswersByRoute["settle"]
	if v.IntentsPublished > 0 {
		v.DuplicateShare = float64(v.Duplicates) / float64(v.IntentsPublished)
	}
	v.Violations = violations(v, f.allowOutage)
	if f.powerLossWanted && v.PowerLoss == nil {
		v.Violations = append(v.Violations, "the power loss did not happen (see the run's log)")
	}
	if pl := v.PowerLoss; pl != nil && f.durability.replicas > 1 && pl.IntentsTaken > 0 {
		v.Violations = append(v.Violations, fmt.Sprintf("the power loss of one node took %d acknowledged intents of a replicated work stream", pl.IntentsTaken))
	}
	v.OK = len(v.Violations) == 0
}

// judgePowerLoss counts the copies the power loss took — stored and
// acknowledged by the JetStream start it cut, above the work stream's last
// sequence it kept — and how many of them were republished and answered,
// and the acknowledged ledger writes it took.
func judgePowerLoss(pl *PowerLoss, ops []*op) {
	kept, ok := pl.After[pl.WorkStream]
	for _, o := range ops {
		for _, c := range o.copies {
			if !ok || !c.Published || c.Duplicate || c.Epoch != pl.epoch || c.Seq <= kept {
				continue
			}
			pl.IntentsTaken++
			if c.Republished > 0 {
				pl.Republished++
			}
			if c.Status != "" {
				pl.Answered++
			}
		}
	}
	pl.LedgerWritesTaken = map[string]uint64{}
	for name, before := range pl.Before {
		if after, ok := pl.After[name]; strings.HasPrefix(name, "KV_") && (!ok || after < before) {
			pl.LedgerWritesTaken[name] = before - after
		}
	}
}

// attribution explains repeats from the facts: who fired each firing, with
// which claim number, who was killed, and what each holder logged.
type attribution struct {
	facts   runFacts
	perKill map[int]int // index in facts.events → crash-window repeats it explains
}

// repeat explains the firings of o (more than one). Each firing after the
// first is explained against the one before it:
//
//   - a later firing whose claim number is not higher than the earlier one's
//     is a second firing of one claim: same_attempt;
//   - else, when the earlier firing's own holder was killed after its
//     attempt began (its first request of that claim, 503s included) and
//     before the later claim's first request: worker_kill, the crash window
//     — unless the holder logged, for this key and in that window but
//     before the kill, that the ledger was unreachable past its lease
//     deadline: then, as when it logged that and was not killed,
//     ledger_outage;
//   - else the holder was alive and connected: unexplained (or
//     phantom_lease_loss when it was told it lost its lease before anyone
//     took the key over).
//
// No fault of another holder, and no outage by its timing alone, explains a
// repeat. The operation's cause is the least explained of its firings.
func (a *attribution) repeat(o *op, all, fired []request) Repeat {
	r := Repeat{Op: o.id, Key: o.key, Tool: o.tool, Firings: len(fired), Requests: len(all), SameKey: true}
	for _, q := range all {
		if q.Key != o.key {
			r.SameKey = false
		}
	}
	byArrival := slices.Clone(fired)
	slices.SortStableFunc(byArrival, func(a, b request) int { return a.Arrived.Compare(b.Arrived) })
	for _, q := range byArrival {
		r.Times = append(r.Times, q.Arrived)
		r.Holders = append(r.Holders, q.Holder)
		r.Attempts = append(r.Attempts, q.Attempt)
	}
	// When each claim (holder, attempt) sent its first request.
	type claim struct {
		holder  string
		attempt int
	}
	began := map[claim]time.Time{}
	for _, q := range all {
		c := claim{q.Holder, q.Attempt}
		if t, ok := began[c]; !ok || q.Arrived.Before(t) {
			began[c] = q.Arrived
		}
	}
	worst, kill := causeCrash, -1
	for i := 1; i < len(byArrival); i++ {
		prev, next := byArrival[i-1], byArrival[i]
		from := began[claim{prev.Holder, prev.Attempt}].Add(-crashWindowSlack)
		to := began[claim{next.Holder, next.Attempt}]
		c, k := a.explain(o.key, prev, next, from, to)
		if causeRank(c) < causeRank(worst) {
			worst = c
		}
		if c == causeCrash {
			a.perKill[k]++
			if kill < 0 {
				kill = k
			}
		}
	}
	r.Cause = worst
	if worst == causeCrash {
		r.Kill = a.facts.events[kill].Target
	}
	return r
}

// explain is the cause of next firing after prev, the holder's window being
// [from, to]; k is the explaining kill's index in the events.
func (a *attribution) explain(key string, prev, next request, from, to time.Time) (cause string, k int) {
	switch {
	case prev.Holder == "" || next.Holder == "" || prev.Attempt < 1 || next.Attempt < 1:
		return causeUnattributed, -1
	case next.Attempt <= prev.Attempt:
		return causeSameAttempt, -1
	}
	hk := holderKey{prev.Holder, key}
	within := func(m map[holderKey]time.Time) (time.Time, bool) {
		t, ok := m[hk]
		return t, ok && !t.Before(from) && !t.After(to)
	}
	_, cut := within(a.facts.leases.cutOff)
	gaveUp, gave := within(a.facts.leases.gaveUp)
	for i, e := range a.facts.events {
		until := e.Until
		if until.IsZero() {
			until = e.At
		}
		if e.Kind != faultWorkerKill || e.Target != prev.Holder || until.Before(from) || e.At.After(to) {
			continue
		}
		if gave && gaveUp.Before(e.At) {
			// The holder, alive, gave its outcome up before it was
			// killed: not the crash window.
			return causeCutOff, -1
		}
		// Killed before it could record — cut off from the ledger
		// meanwhile or not: a cut-off holder keeps its outcome and goes on
		// trying, so only the kill ended it.
		return causeCrash, i
	}
	if gave {
		return causeCutOff, -1
	}
	if cut {
		return causeCutOff, -1
	}
	if t, ok := a.facts.leases.lost[hk]; ok && !t.Before(from) && !t.After(to) {
		if took, ok := a.facts.leases.takeover[key]; !ok || t.Before(took) {
			return causePhantom, -1
		}
	}
	return causeUnexplained, -1
}

// causeRank orders causes from the least explained (0) to the crash window.
func causeRank(c string) int {
	switch c {
	case causeCrash:
		return 3
	case causeCutOff:
		return 2
	case causePhantom:
		return 1
	}
	return 0
}

// judgeKills bounds the crash-window repeats each kill explains by what its
// holder could have had in flight (see KillRepeats.Bound).
func (a *attribution) judgeKills(v *Verdict, byOp map[string][]request) {
	if len(a.perKill) == 0 {
		return
	}
	final := map[string]string{} // op → holder of its final record
	tools := map[string]string{} // op → tool
	for _, o := range a.facts.ops {
		final[o.id], tools[o.id] = o.recordHolder, o.tool
	}
	concurrency := a.facts.concurrency
	if concurrency <= 0 {
		concurrency = math.MaxInt
	}
	for _, k := range slices.Sorted(maps.Keys(a.perKill)) {
		e := a.facts.events[k]
		open := map[string]int{} // tool → operations it started and did not record
		for op, qs := range byOp {
			if final[op] == e.Target {
				continue
			}
			for _, q := range qs {
				if q.Holder == e.Target {
					open[tools[op]]++
					break
				}
			}
		}
		kr := KillRepeats{Holder: e.Target, At: e.At, Repeats: a.perKill[k]}
		for tool, n := range open {
			kr.Unrecorded += n
			limit := concurrency
			if c, ok := a.facts.caps[tool]; ok && c < limit {
				limit = c
			}
			kr.Bound += min(n, limit)
		}
		kr.Bound = min(kr.Bound, concurrency)
		v.CrashPerKill = append(v.CrashPerKill, kr)
		if kr.Repeats > v.CrashMaxPerKill {
			v.CrashMaxPerKill, v.CrashMaxBound, v.crashMax = kr.Repeats, kr.Bound, kr
		}
	}
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
	add(slices.Equal(v.Durability, v.DurabilityDeclared), "the run used durability settings it did not declare: it ran with %s and declared %s",
		durabilityLabel(v.Durability), durabilityLabel(v.DurabilityDeclared))
	if pl := v.PowerLoss; pl != nil {
		add(pl.Answered == pl.IntentsTaken, "%d of the %d acknowledged intents the power loss took were never answered", pl.IntentsTaken-pl.Answered, pl.IntentsTaken)
		add(len(pl.LedgerWritesTaken) == 0, "the power loss took acknowledged ledger writes (last sequence back by): %v", pl.LedgerWritesTaken)
	}
	// A delayed copy is sent a window after its original (and after the last
	// server restart); a server restarted mid-load may still keep an entry a
	// little longer (docs/reliability.md, "Unexplained"). More than 1% means
	// the load does not test what it says.
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
	add(v.Unattributed == 0, "%d sink requests carried no Idem-Holder or Idem-Attempt", v.Unattributed)
	add(v.RepeatsOtherKey == 0, "%d repeated operations carried another Idempotency-Key", v.RepeatsOtherKey)
	add(v.RepeatsSameAtt == 0, "%d operations fired twice under one claim (the later firing's attempt is not higher)", v.RepeatsSameAtt)
	add(v.RepeatsUnexplain == 0, "%d operations fired again while the earlier firing's holder was alive and connected (neither killed nor cut off from the ledger by its own log)", v.RepeatsUnexplain)
	add(v.RepeatsPhantom == 0, "%d operations fired again after their live holder was told its lease was lost before anyone took it over", v.RepeatsPhantom)
	add(allowOutage || v.RepeatsOutage == 0, "%d operations fired again while their holder, cut off from the ledger, was alive or had given its outcome up", v.RepeatsOutage)
	var over []string
	for _, k := range v.CrashPerKill {
		if k.Repeats > k.Bound {
			over = append(over, fmt.Sprintf("%s %d > %d", k.Holder, k.Repeats, k.Bound))
		}
	}
	add(len(over) == 0, "%d worker kills explain more repeats than their holder could have had in flight: %s", len(over), strings.Join(over, ", "))
	add(v.FiredMoreThanOnce == 0 || v.FaultsByKind[faultWorkerKill]+v.FaultsByKind[faultJetStream]+v.FaultsByKind[faultNode]+v.FaultsByKind[faultLedgerOutage]+v.FaultsByKind[faultPowerLoss] > 0,
		"%d operations fired more than once in a run without process faults", v.FiredMoreThanOnce)
	return out
}

// print writes the verdict for people.
func (v *Verdict) print(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("chaos verdict (%s, seed %d, %.0fs)", v.Mode, v.Seed, v.DurationSeconds)
	p("  durability                   %s (declared: %s)", durabilityLabel(v.Durability), durabilityLabel(v.DurabilityDeclared))
	p("  intents published            %d", v.IntentsPublished)
	p("  unique operations            %d", v.UniqueOperations)
	p("  duplicates injected          %d (%.1f%% of intents) %s", v.Duplicates, 100*v.DuplicateShare, sortedMap(v.DuplicatesByKind))
	p("  publishes deduplicated       %d (delayed copies among them: %d)", v.PublishDuplicate, v.DelayedDeduped)
	p("  publish retries              %d (copies never published: %d) %s", v.PublishRetries, v.PublishFailed, sortedMap(v.PublishErrors))
	p("  faults injected              %s", sortedMap(v.FaultsByKind))
	if pl := v.PowerLoss; pl != nil {
		p("  power loss                   %s: %d store files cut by %d bytes; took %d acknowledged intents, %d republished by their callers (7.2), %d answered; took %d ledger writes",
			pl.Node, pl.FilesCut, pl.BytesCut, pl.IntentsTaken, pl.Republished, pl.Answered, sumValues(pl.LedgerWritesTaken))
	}
	p("  publishes under retry rule   %d", v.Republished)
	p("  lease takeovers              %d (live holders that lost their lease: %d; worker exits not injected: %d)",
		v.LeaseTakeovers, v.LiveLeaseLosses, v.WorkerCrashes)
	p("  results received             %d %s", v.ResultsReceived, sortedMap(v.AnswersByRoute))
	p("  settled from the ledger      %d", v.SettledByLedger)
	p("  unanswered copies            %d", v.Unanswered)
	p("  sink requests                %d (without holder or attempt: %d)", v.SinkRequests, v.Unattributed)
	p("  effects observed (2xx)       %d", v.EffectsObserved)
	p("  operations fired             %d", v.OperationsFired)
	p("  lost operations              %d (never fired, answered otherwise: %d)", v.LostOperations, v.NeverFired)
	if len(v.ByTool) > 1 {
		for _, tool := range slices.Sorted(maps.Keys(v.ByTool)) {
			t := v.ByTool[tool]
			p("  tool %-23s %d operations, %d fired, %d lost, %d unanswered copies, %d fired more than once (crash window %d)", tool, t.Operations, t.Fired, t.Lost, t.Unanswered, t.Repeats, t.CrashRepeats)
		}
	}
	p("  fired more than once         %d (extra firings %d: crash window %d, ledger outage %d, phantom lease loss %d, same attempt %d, other key %d, unexplained %d)",
		v.FiredMoreThanOnce, v.ExtraFirings, v.RepeatsCrash, v.RepeatsOutage, v.RepeatsPhantom, v.RepeatsSameAtt, v.RepeatsOtherKey, v.RepeatsUnexplain)
	if m := v.crashMax; m.Repeats > 0 {
		p("  crash window per kill        largest %d (kill of %s), bound %d (its in-flight cap, concurrency %d or a tool's max_in_flight, and the %d operations it started and did not record); %d kills explain a repeat",
			m.Repeats, m.Holder, m.Bound, v.Concurrency, m.Unrecorded, len(v.CrashPerKill))
	} else {
		p("  crash window per kill        none")
	}
	p("  disagreeing answers          %d", v.DisagreeingAnswers)
	p("  unexpected answers           %s", sortedMap(v.UnexpectedAnswers))
	for _, r := range v.Repeats {
		p("  repeat: %s fired %d times by %s, attempts %v, same key %t, cause %s", r.Op, r.Firings, strings.Join(r.Holders, " then "), r.Attempts, r.SameKey, r.Cause)
	}
	if v.OK {
		p("OK: nothing lost, nothing fired twice outside the crash window of a killed holder")
		return
	}
	p("VIOLATIONS:")
	for _, s := range v.Violations {
		p("  - %s", s)
	}
}

func sumValues(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
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

// holderKey is one holder's view of one key.
type holderKey struct{ holder, key string }

// leaseLog is what the worker logs say about the leases of each key.
type leaseLog struct {
	lost     map[holderKey]time.Time // a holder's first "lease lost" line for a key: it was alive
	cutOff   map[holderKey]time.Time // a holder's first "ledger unreachable past the lease deadline" line for a key
	gaveUp   map[holderKey]time.Time // a holder's first "outcome not recorded" line for a key: it let its outcome go
	takeover map[string]time.Time    // the key's first "lease taken over", by any holder
}

func newLeaseLog() leaseLog {
	return leaseLog{lost: map[holderKey]time.Time{}, cutOff: map[holderKey]time.Time{}, gaveUp: map[holderKey]time.Time{}, takeover: map[string]time.Time{}}
}

// lostKeys counts the keys whose holder logged, alive, that it lost its
// lease.
func (l leaseLog) lostKeys() int {
	keys := map[string]bool{}
	for hk := range l.lost {
		keys[hk.key] = true
	}
	return len(keys)
}

// workerLog is the log file of one holder: one start of a worker.
type workerLog struct {
	holder string
	path   string
}

// readLeaseLog reads worker logs (JSON lines).
func readLeaseLog(logs []workerLog) leaseLog {
	out := newLeaseLog()
	for _, wl := range logs {
		f, err := os.Open(wl.path)
		if err != nil {
			continue
		}
		readLeaseLines(f, wl.holder, out)
		f.Close()
	}
	return out
}

// readLeaseLines adds holder's lines from r to out.
func readLeaseLines(r io.Reader, holder string, out leaseLog) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	earliest := func(m map[holderKey]time.Time, k holderKey, t time.Time) {
		if old, ok := m[k]; !ok || t.Before(old) {
			m[k] = t
		}
	}
	for sc.Scan() {
		text := sc.Text()
		if !strings.Contains(text, leaseLostLine) && !strings.Contains(text, cutOffLine) && !strings.Contains(text, gaveUpLine) && !strings.Contains(text, leaseTakenOverLine) {
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
		hk := holderKey{holder, line.Key}
		switch {
		case strings.Contains(text, leaseLostLine):
			earliest(out.lost, hk, t)
		case strings.Contains(text, cutOffLine):
			earliest(out.cutOff, hk, t)
		case strings.Contains(text, gaveUpLine):
			earliest(out.gaveUp, hk, t)
		default:
			if old, ok := out.takeover[line.Key]; !ok || t.Before(old) {
				out.takeover[line.Key] = t
			}
		}
	}
}
