package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// probeTakeover asks the downstream of an operation taken over from a
// vanished holder, with its tool's probe, whether the operation happened
// before it is fired again or held: done settles it completed with the
// downstream's result (settled: nothing fires); not done and unknown are
// returned for act to follow (fire; on_abandoned). The evidence stays on
// the record either way.
func (w *Worker) probeTakeover(work context.Context, j *job, c claim) (r round, verdict effects.Verdict, settled bool) {
	rec := c.Lease.Record()
	// While the downstream is asked, the lease is extended (the message is
	// kept by the intent's keep-alive), as while an effect fires: a probe
	// slower than the lease must not let another worker take the key over.
	pctx, cancel := context.WithCancel(work)
	j.detach()
	halt := w.beats.guard(work, nil, min(j.tool.Lease, w.cfg.AckWait)/3, j.tool.Lease, func(ctx context.Context) error {
		return c.Lease.Extend(ctx, j.tool.Lease)
	}, func(bool) { cancel() })
	ans := w.probe(pctx, j.tool, effects.Call{
		Key: j.id.Key, Tool: j.env.Tool, Session: j.env.Session, CallID: j.env.CallID, Args: j.env.Args,
		Attempt: rec.Attempt, Holder: w.cfg.Holder, Trace: traceHeaders(work),
	})
	halt()
	cancel()
	p := probeEvidence(j.id.Key, ans)
	if ans.Verdict != effects.VerdictDone {
		// Kept before acting on it: an operator reading an uncertain record,
		// or a record fired again, sees what the downstream said.
		err := c.Lease.NoteProbe(work, p)
		switch {
		case errors.Is(err, dedup.ErrLeaseLost):
			return claimAgain, ans.Verdict, true
		case err != nil:
			w.log.Warn("keep the probe's evidence", zap.String("key", j.id.Key), zap.Error(err))
		}
		return round{}, ans.Verdict, false
	}
	// The previous holder's firing happened: record it, with what the
	// downstream reported as its result, and fire nothing.
	w.log.Info("probe found the operation done downstream; settled without firing", zap.String("key", j.id.Key),
		zap.String("previous_holder", c.Previous.Holder), zap.Int("previous_attempt", c.Previous.Attempt))
	got, err := w.record(work, j, func(ctx context.Context) (dedup.Record, error) { return c.Lease.SettleProbed(ctx, p, ans.Result) })
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		return claimAgain, ans.Verdict, true
	case err != nil:
		w.log.Warn("record the probed outcome", zap.String("key", j.id.Key), zap.Error(err))
		return ended(unanswered(nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable"))), ans.Verdict, true
	}
	w.answers.put(j.id.Key, got)
	// The answer reports what the vanished holder's call caused: a replay
	// unless that call is this one, delivered again.
	return ended(answered(w.fromRecord(j, got, !c.Previous.CausedBy(j.seq, j.submission)), ack())), ans.Verdict, true
}

// probe runs tool's probe for call and returns its answer: unknown, with
// the evidence of what was asked, when it got none. The probe bounds its
// own time; the trail and the metrics count it.
func (w *Worker) probe(ctx context.Context, tool *effects.Tool, call effects.Call) effects.ProbeAnswer {
	ans, err := tool.Prober.Probe(ctx, call)
	if err != nil {
		ans.Verdict, ans.Result = effects.VerdictUnknown, nil
		w.log.Warn("probe got no answer", zap.String("key", call.Key), zap.Error(err))
	}
	switch ans.Verdict {
	case effects.VerdictDone:
		if len(ans.Result) == 0 || !json.Valid(ans.Result) {
			ans.Result = json.RawMessage("null")
		}
	case effects.VerdictNotDone:
	default:
		ans.Verdict = effects.VerdictUnknown
	}
	w.log.Info("probed the downstream", zap.String("key", call.Key), zap.String("verdict", string(ans.Verdict)),
		zap.String("request", ans.Evidence.Request), zap.String("status", ans.Evidence.Status))
	w.obs.probed(tool, call, ans)
	return ans
}

// probeEvidence is ans, the answer of a probe of key, as the record keeps
// it.
func probeEvidence(key string, ans effects.ProbeAnswer) dedup.Probe {
	return dedup.Probe{At: time.Now().UTC(), Key: key, Verdict: string(ans.Verdict), Request: ans.Evidence.Request,
		Status: ans.Evidence.Status, Body: effects.ClipEvidence(ans.Evidence.Body)}
}

// probeUncertain probes the uncertain operation under key (rec, its
// record) and records the verdict: done completes it with the downstream's
// result, anything else leaves it uncertain with the evidence. It returns
// the written record; dedup.ErrWrongState when the record is not uncertain
// or its tool has no probe.
func (w *Worker) probeUncertain(ctx context.Context, key string, rec dedup.Record) (dedup.Record, error) {
	tool, ok := w.tools.Lookup(rec.Tool)
	switch {
	case rec.Status != intent.StatusUncertain:
		return rec, wrongState("%s, not uncertain: only an uncertain operation is probed", rec.Status)
	case !ok || tool.Prober == nil:
		return rec, wrongState("uncertain, but its tool %s has no probe: resolve it by hand", rec.Tool)
	}
	if intent.CompactLedgerKey(key) {
		// Names no key the downstream knows.
		return rec, wrongState("%s is a compact ledger key: probe the operation by its full key", key)
	}
	call := effects.Call{Key: key, Tool: rec.Tool, Session: rec.Session, CallID: rec.CallID, Attempt: rec.Attempt, Holder: w.cfg.Holder}
	ans := w.probe(ctx, tool, call)
	got, _, err := w.ledger.ProbeUncertain(ctx, key, probeEvidence(key, ans), ans.Result)
	return got, err
}

// wrongState is a dedup.ErrWrongState error with a message.
func wrongState(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{dedup.ErrWrongState}, args...)...)
}

// maxScanProbes bounds the uncertain records one ledger scan probes; the
// next scan probes the rest.
const maxScanProbes = 64

// probeable reports whether rec is an uncertain record whose tool has a
// probe, under a key the downstream knows.
func (w *Worker) probeable(rec dedup.Record) bool {
	if rec.Status != intent.StatusUncertain {
		return false
	}
	t, ok := w.tools.Lookup(rec.Tool)
	return ok && t.Prober != nil
}

// probeScanned probes the uncertain records a ledger scan found, one at a
// time: one the downstream reports done is completed with its result, the
// others keep the new evidence.
func (w *Worker) probeScanned(ctx context.Context, recs []dedup.Listed) {
	for _, r := range recs {
		if ctx.Err() != nil {
			return
		}
		key := r.Key
		if intent.CompactLedgerKey(key) {
			// A compact ledger lists the stored key: the downstream knows
			// the full one, which an earlier probe of it recorded.
			if r.Probe == nil {
				continue
			}
			if sk, err := intent.LedgerKey(r.Probe.Key, w.store.Layout()); err != nil || sk != key {
				continue
			}
			key = r.Probe.Key
		}
		got, err := w.probeUncertain(ctx, key, r.Record)
		switch {
		case errors.Is(err, dedup.ErrWrongState):
			// Resolved meanwhile.
		case err != nil:
			w.log.Warn("probe an uncertain record", zap.String("key", key), zap.Error(err))
		case got.Status == intent.StatusCompleted:
			w.obs.recorded(key, got)
			w.log.Info("probe found an uncertain operation done downstream; completed", zap.String("key", key))
		}
	}
}
