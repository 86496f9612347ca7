package worker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// scanElection is the ledger election (dedup.Ledger.Elect) of the worker
// that scans the ledger in a round: it lasts one round.
const scanElection = "scan"

// Unresolved states and ages, as the ledger scan counts them.
var (
	unresolvedStates = []string{"pending", "pending_past_lease", "approved", "awaiting_approval", "uncertain"}
	unresolvedAges   = []struct {
		label string
		below time.Duration // 0: no upper bound
	}{{"under_1h", time.Hour}, {"1h_to_24h", 24 * time.Hour}, {"over_24h", 0}}
)

// scanLedger runs the ledger scan every LedgerScan until ctx is done. Each
// round one worker — the one the round's election makes its scanner —
// brings its view of the ledger up to date (dedup.Tracker: what was written
// since its last round, the whole ledger the first time): it counts the
// unresolved records (nothing expires them, so none may sit unseen) by
// state and age, gives final records written without a per-message TTL (by
// an earlier version, whose bucket expired records by age) their TTL, and
// probes the uncertain records whose tool has a probe (probe.go). The other
// workers clear their counts, so that summing the gauge over workers gives
// the ledger's; each keeps its view, and catches up when it scans again.
func (w *Worker) scanLedger(ctx context.Context) {
	for {
		// A little jitter, so that workers started together do not all
		// try at once.
		t := time.NewTimer(w.cfg.LedgerScan + time.Duration(rand.Int64N(int64(w.cfg.LedgerScan/10)+1)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := w.scanRound(ctx, w.cfg.LedgerScan); err != nil && ctx.Err() == nil {
			w.log.Warn("ledger scan", zap.Error(err))
		}
	}
}

// scanRound is one round of scanLedger, which lasts round.
func (w *Worker) scanRound(ctx context.Context, round time.Duration) error {
	won, err := w.store.Elect(ctx, scanElection, w.cfg.Holder, round)
	if err != nil {
		return err
	}
	if !won {
		w.m.unresolved.Reset() // another worker scans this round
		w.m.unresolvedOldest.Reset()
		return nil
	}
	// Leaders gather on the nodes that stayed up when one restarts: spread
	// them again each round.
	spreadLeaders(ctx, w.store, w.log)
	if w.tracked == nil {
		w.tracked = w.store.Track()
	}
	retained := 0
	if _, err := w.tracked.Update(ctx, func(r dedup.Listed) error {
		if err := w.store.Retain(ctx, r); err != nil {
			return err
		}
		retained++
		return nil
	}); err != nil {
		return err
	}
	t := w.tally(w.tracked.Unresolved(), time.Now())
	for _, st := range unresolvedStates {
		for _, a := range unresolvedAges {
			w.m.unresolved.WithLabelValues(st, a.label).Set(float64(t.counts[[2]string{st, a.label}]))
		}
		w.m.unresolvedOldest.WithLabelValues(st).Set(t.oldest[st].Seconds())
	}
	w.m.retained.Add(float64(retained))
	w.m.scans.Inc()
	w.probeScanned(ctx, t.uncertain)
	if retained > 0 {
		w.log.Info("final records written without a TTL were given theirs", zap.Int("records", retained))
	}
	return nil
}

// scanTally is what a ledger scan found.
type scanTally struct {
	counts    map[[2]string]int        // unresolved records by state and age label
	oldest    map[string]time.Duration // the age of the oldest of each state
	uncertain []dedup.Listed           // the first maxScanProbes to probe, in scan order
}

// tally counts the unresolved records us, in scan order, at now.
func (w *Worker) tally(us []dedup.Unresolved, now time.Time) scanTally {
	t := scanTally{counts: map[[2]string]int{}, oldest: map[string]time.Duration{}}
	for _, u := range us {
		state := unresolvedState(u, now)
		if u.Uncertain != nil && w.probeable(u.Uncertain.Record) && len(t.uncertain) < maxScanProbes {
			t.uncertain = append(t.uncertain, *u.Uncertain)
		}
		age := now.Sub(u.UpdatedAt)
		t.counts[[2]string{state, ageLabel(age)}]++
		t.oldest[state] = max(t.oldest[state], age)
	}
	return t
}

// spreadLeaders moves the leaders of a replicated, partitioned ledger so
// that each node leads its share: otherwise a cluster's ledger writes may
// all go to one node.
func spreadLeaders(ctx context.Context, ledger *dedup.Ledger, log *zap.Logger) {
	if ledger.Partitions() < 2 {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	moved, err := ledger.SpreadLeaders(sctx)
	if err != nil {
		log.Warn("spreading the ledger's partition leaders", zap.Error(err))
	} else if moved > 0 {
		log.Info("moved ledger partition leaders to spread them over the cluster", zap.Int("moved", moved))
	}
}

// unresolvedState is the state the scan counts u under.
func unresolvedState(u dedup.Unresolved, now time.Time) string {
	if u.PastLease(now) {
		return "pending_past_lease"
	}
	return string(u.Status)
}

func ageLabel(age time.Duration) string {
	for _, a := range unresolvedAges {
		if a.below == 0 || age < a.below {
			return a.label
		}
	}
	return unresolvedAges[len(unresolvedAges)-1].label
}

// unresolvedMetrics are the ledger scan's gauges and counters.
func unresolvedMetrics() (records, oldest *prometheus.GaugeVec, scans, retained prometheus.Counter) {
	records = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "idemgate", Name: "ledger_unresolved_records",
		Help: "Unresolved ledger records (never expired: each needs a retry, an operator or its holder), by state and time since last written, as of the last ledger scan this worker made (0 when another worker made it: sum over workers)."},
		[]string{"state", "age"})
	oldest = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "idemgate", Name: "ledger_unresolved_oldest_seconds",
		Help: "Time since the oldest unresolved record of each state was last written, as of the last ledger scan this worker made."},
		[]string{"state"})
	scans = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idemgate", Name: "ledger_scans_total",
		Help: "Ledger scans this worker made (one worker scans each round)."})
	retained = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idemgate", Name: "ledger_records_retained_total",
		Help: "Final records written without a per-message TTL (by an earlier version) that a scan gave their TTL."})
	return records, oldest, scans, retained
}
