package worker

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// Metrics are the worker's Prometheus metrics. Counters and histograms are
// labelled by tool; intents whose tool is not configured count under "_unknown".
type Metrics struct {
	received    *prometheus.CounterVec
	fired       *prometheus.CounterVec
	replays     *prometheus.CounterVec
	cacheHits   *prometheus.CounterVec
	coalesced   *prometheus.CounterVec
	conflicts   *prometheus.CounterVec
	failures    *prometheus.CounterVec
	takeovers   *prometheus.CounterVec
	probes      *prometheus.CounterVec
	badInputs   *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	decisions   *prometheus.CounterVec
	limited     *prometheus.CounterVec
	effectTime  *prometheus.HistogramVec
	claimToDone *prometheus.HistogramVec
	endToEnd    *prometheus.HistogramVec
	inFlight    prometheus.Gauge
	badReplies  prometheus.Counter
	// overBudget counts operations over their tool's effect budget.
	overBudget *prometheus.CounterVec
	// The ledger scan's (janitor.go).
	unresolved       *prometheus.GaugeVec
	unresolvedOldest *prometheus.GaugeVec
	scans, retained  prometheus.Counter
	knownTools       map[string]bool
	unknownLabel     string
	// batchStats reads the worker's group-commit counts at scrape time; nil
	// until the worker is built.
	batchStats atomic.Pointer[func() dedup.BatchStats]
	// auditStats reads the audit trail's counts at scrape time (audit.go).
	auditStats atomic.Pointer[func() auditCounts]
}

// NewMetrics creates the worker's metrics and registers them with reg (nil:
// not registered, for tests and embedding).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: name, Help: help}, labels)
	}
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	h := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "idemgate", Name: name, Help: help, Buckets: buckets}, []string{"tool"})
	}
	m := &Metrics{
		received:    f("intents_received_total", "Intents delivered to this worker, redeliveries included.", "tool"),
		fired:       f("effects_fired_total", "Effects fired successfully: operations that happened.", "tool"),
		replays:     f("replays_total", "Intents answered from the ledger without firing.", "tool"),
		cacheHits:   f("answer_cache_hits_total", "Duplicates answered from this worker's cache of final records, without a ledger read (counted in replays_total too).", "tool"),
		coalesced:   f("coalesced_waits_total", "Duplicates that waited for an in-flight holder (or shared a read) instead of firing.", "tool"),
		conflicts:   f("conflicts_total", "Intents refused because their key was used with other arguments.", "tool"),
		failures:    f("effect_failures_total", "Effect failures, by kind: transient (retried later) or permanent (recorded).", "tool", "kind"),
		takeovers:   f("lease_takeovers_total", "Keys taken over from a holder whose lease expired.", "tool"),
		probes:      f("probes_total", "Reconciliation probes of the downstream, by verdict: done (settled without firing), not_done, unknown.", "tool", "verdict"),
		badInputs:   f("bad_intents_total", "Intents rejected as bad input, by error code.", "tool", "code"),
		deadLetters: f("dead_letters_total", "Messages copied to the dead-letter stream.", "tool"),
		decisions:   f("operator_decisions_total", "Operator decisions applied, by operation.", "op"),
		limited:     f("limited_total", "Intents held back by a limit: session_rate (answered rate_limited) or tool_in_flight (queued, held until the tool has room).", "tool", "limit"),
		effectTime:  h("effect_duration_seconds", "Time an effect took to fire, retries included."),
		claimToDone: h("claim_to_complete_seconds", "Time from winning the claim to the recorded outcome."),
		endToEnd:    h("intent_end_to_end_seconds", "Time from the intent's publish (its stream timestamp) to its answer."),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idemgate", Name: "intents_in_flight",
			Help: "Intents this worker is handling now."}),
		badReplies: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idemgate", Name: "refused_reply_subjects_total",
			Help: "Answers not published because the intent's Idem-Reply-To named a subject outside the reply prefixes."}),
		unknownLabel: "_unknown",
	}
	m.overBudget = f("budget_exceeded_total", "New operations over their tool's effect budget: answered budget_exceeded and never fired, or parked for an approval (over_budget: approve).", "tool")
	m.unresolved, m.unresolvedOldest, m.scans, m.retained = unresolvedMetrics()
	if reg != nil {
		reg.MustRegister(m.received, m.fired, m.replays, m.cacheHits, m.coalesced, m.conflicts, m.failures, m.takeovers, m.probes,
			m.badInputs, m.deadLetters, m.decisions, m.limited, m.effectTime, m.claimToDone, m.endToEnd, m.inFlight, m.badReplies,
			m.unresolved, m.unresolvedOldest, m.scans, m.retained, batchCollector{m}, auditCollector{m})
		reg.MustRegister(m.overBudget)
	}
	return m
}

// The group commit's counters (dedup.BatchStats), read at scrape time.
var (
	batchesDesc = prometheus.NewDesc("idemgate_ledger_batches_total",
		"Atomic batches of ledger writes committed (group commit).", nil, nil)
	batchedWritesDesc = prometheus.NewDesc("idemgate_ledger_batched_writes_total",
		"Ledger writes committed in atomic batches; over idemgate_ledger_batches_total, the average batch.", nil, nil)
	singleWritesDesc = prometheus.NewDesc("idemgate_ledger_single_writes_total",
		"Ledger writes sent one by one by the group commit: too few queued to pay for a batch, or a fallback.", nil, nil)
	batchResentDesc = prometheus.NewDesc("idemgate_ledger_batches_resent_total",
		"Batches sent again after a refusal (one write's expectation failed, or a key was still being written).", nil, nil)
	batchFallbacksDesc = prometheus.NewDesc("idemgate_ledger_batch_fallbacks_total",
		"Batches whose writes went out one by one because the batch was refused as a whole: rising with every batch means the server takes no atomic batches (nats-server 2.12+ needed).", nil, nil)
)

// batchCollector exports the worker's group-commit counts.
type batchCollector struct{ m *Metrics }

func (c batchCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{batchesDesc, batchedWritesDesc, singleWritesDesc, batchResentDesc, batchFallbacksDesc} {
		ch <- d
	}
}

func (c batchCollector) Collect(ch chan<- prometheus.Metric) {
	var st dedup.BatchStats
	if f := c.m.batchStats.Load(); f != nil {
		st = (*f)()
	}
	for d, v := range map[*prometheus.Desc]uint64{batchesDesc: st.Batches, batchedWritesDesc: st.BatchedWrites,
		singleWritesDesc: st.SingleWrites, batchResentDesc: st.Resent, batchFallbacksDesc: st.Fallbacks} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
}

// tool is the label for tool: the name when configured, else "_unknown", so
// that bad input cannot create unbounded label values.
func (m *Metrics) tool(tool string) string {
	if m.knownTools[tool] {
		return tool
	}
	return m.unknownLabel
}

// since is seconds since t, or -1 when t is zero.
func since(t time.Time) float64 {
	if t.IsZero() {
		return -1
	}
	return time.Since(t).Seconds()
}
