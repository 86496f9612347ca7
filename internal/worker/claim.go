package worker

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// claim claims the intent's key and fires, replays, or waits for the holder.
// While the ledger cannot be reached it holds the intent (no delivery is
// spent) and tries again: an outage delays an operation, it never ends one.
func (w *Worker) claim(stop, work context.Context, j *job) verdict {
	req := dedup.ClaimRequest{
		Key:         j.id.Key,
		Tool:        j.env.Tool,
		Fingerprint: j.id.Fingerprint,
		Holder:      w.cfg.Holder,
		Lease:       j.tool.Lease,
		IntentSeq:   j.seq,
		CallID:      j.env.CallID,
		Session:     j.env.Session,
		// Delivered before: the key most likely has a record already.
		ReadFirst: j.meta.NumDelivered > 1,
	}
	if rec, ok := w.answers.get(req.Key); ok {
		// A final record this worker wrote or read a moment ago: no need
		// to ask the ledger again.
		w.mark(&j.stages.Claimed)
		w.m.cacheHits.WithLabelValues(j.env.Tool).Inc()
		return w.replay(j, rec)
	}
	outage := w.outage(stop, j)
	defer outage.end()
	waitUntil := time.Now().Add(w.cfg.MaxWait)
	for {
		c, err := w.ledger.Claim(stop, req)
		if err != nil {
			if unavailable(err) && outage.wait(err) {
				continue
			}
			w.log.Warn("claim", zap.String("key", req.Key), zap.Error(err))
			return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable")
		}
		outage.over()
		w.mark(&j.stages.Claimed)
		switch c.Outcome {
		case dedup.Acquired, dedup.TookOver:
			w.audit.claimed(j, c.ClaimResult, req.Confirmed != 0)
			v, again := w.actOnLease(stop, work, j, c)
			if again {
				continue
			}
			return v
		case dedup.Done, dedup.Conflict:
			w.answers.put(req.Key, c.Record)
			return w.replay(j, c.Record)
		case dedup.Busy:
			if rec := c.Record; rec.Status == intent.StatusPending && !rec.Released() && rec.LeaseExpired(time.Now()) {
				// The lease expired: confirm the holder is gone — its record
				// stays unchanged for a grace period on this worker's clock —
				// before taking over. After an outage of the ledger every
				// live lease has expired at once; a live holder extends (or
				// records) within its heartbeat period, shorter than the grace.
				changed, err := w.confirmAbandoned(stop, j, c.Revision)
				switch {
				case err != nil && outage.wait(err):
					// The grace proved nothing while the ledger could not
					// be read: count it again once it can.
				case err != nil:
					return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable")
				case !changed:
					req.Confirmed = c.Revision
				}
				continue
			}
			// Wait for the holder (push, not poll) up to its lease, bounded by
			// MaxWait unless this is the last delivery.
			w.log.Debug("waiting for the holder", zap.String("key", req.Key), zap.String("holder", c.Record.Holder))
			rec, err := w.await(stop, j, waitUntil)
			switch {
			case err == nil && rec.Status.Answered():
				w.answers.put(req.Key, rec)
				if rec.Fingerprint == j.id.Fingerprint {
					w.m.coalesced.WithLabelValues(j.env.Tool).Inc()
				}
				return w.replay(j, rec)
			case err == nil, errors.Is(err, dedup.ErrReleased):
				continue // the lease expired or was released: claim again
			default:
				return nak(w.cfg.RetryDelay, "holder still in flight")
			}
		default:
			return nak(w.cfg.RetryDelay, "unknown claim outcome")
		}
	}
}

// replay answers j from rec, a record of its key that answers it without
// this worker firing: a conflict when the fingerprints differ (Claim reports
// that as Conflict, Done otherwise), else the record's outcome — a replay
// unless j's own call caused it (the same intent delivered again).
func (w *Worker) replay(j *job, rec dedup.Record) verdict {
	res := w.fromRecord(j, rec, rec.IntentSeq != j.seq)
	if rec.Fingerprint != j.id.Fingerprint {
		w.m.conflicts.WithLabelValues(j.env.Tool).Inc()
		res.Receipt = w.audit.conflict(j, res)
	} else {
		w.m.replays.WithLabelValues(j.env.Tool).Inc()
	}
	w.answer(j, res)
	return ack()
}

// confirmAbandoned watches the key for the takeover grace (one more lease of
// the tool) and reports whether its record moved past rev meanwhile. A live
// holder cut off by an outage reconnects, and extends or records, well within
// it: its heartbeat runs every third of a lease.
func (w *Worker) confirmAbandoned(stop context.Context, j *job, rev uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(stop, j.tool.Lease)
	defer cancel()
	j.detach()
	halt := w.beats.hold(ctx, j.msg, w.cfg.AckWait/3)
	defer halt()
	changed, err := w.ledger.WaitChange(ctx, j.id.Key, rev)
	if err == nil && !changed && stop.Err() != nil {
		return false, stop.Err() // stopping, not confirmed
	}
	return changed, err
}

// await waits for the key's holder, keeping the message alive meanwhile.
func (w *Worker) await(stop context.Context, j *job, until time.Time) (dedup.Record, error) {
	ctx, cancel := context.WithCancel(stop)
	if !w.lastDelivery(j) {
		ctx, cancel = context.WithDeadline(stop, until)
	}
	defer cancel()
	j.detach()
	halt := w.beats.hold(ctx, j.msg, w.cfg.AckWait/3)
	defer halt()
	rec, _, err := w.ledger.Wait(ctx, j.id.Key)
	return rec, err
}

// ledgerOutage holds one intent through an outage of the ledger: its
// message is kept (InProgress) while the handler pauses between tries,
// backing off.
type ledgerOutage struct {
	w     *Worker
	stop  context.Context
	j     *job
	pause time.Duration
	since time.Time
	halt  func() // the hold of the message; nil outside an outage
}

func (w *Worker) outage(stop context.Context, j *job) *ledgerOutage {
	return &ledgerOutage{w: w, stop: stop, j: j}
}

// wait holds the intent and pauses before the next try; false when the
// worker is stopping (or err is not the ledger being unreachable), so that
// the intent is left to another worker.
func (o *ledgerOutage) wait(err error) bool {
	if o.stop.Err() != nil || !unavailable(err) {
		return false
	}
	if o.halt == nil {
		o.j.detach()
		o.since, o.pause = time.Now(), 100*time.Millisecond
		o.halt = o.w.beats.hold(o.stop, o.j.msg, o.w.cfg.AckWait/3)
		o.w.log.Warn("ledger unreachable; holding the intent until it is back", zap.String("key", o.j.id.Key), zap.Error(err))
	}
	t := time.NewTimer(o.pause)
	defer t.Stop()
	select {
	case <-t.C:
		o.pause = min(2*o.pause, 2*time.Second)
		return true
	case <-o.stop.Done():
		return false
	}
}

// over ends the hold once the ledger answered.
func (o *ledgerOutage) over() {
	if o.halt != nil {
		o.w.log.Info("ledger reachable again", zap.String("key", o.j.id.Key), zap.Duration("after", time.Since(o.since)))
		o.end()
	}
}

func (o *ledgerOutage) end() {
	if o.halt != nil {
		o.halt()
		o.halt = nil
	}
}
