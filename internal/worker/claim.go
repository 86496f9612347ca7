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
func (w *Worker) claim(stop, work context.Context, j *job) verdict {
	req := dedup.ClaimRequest{
		Key:         j.id.Key,
		Tool:        j.env.Tool,
		Fingerprint: j.id.Fingerprint,
		Holder:      w.cfg.Holder,
		Lease:       j.tool.Lease,
		IntentSeq:   j.meta.Sequence.Stream,
		CallID:      j.env.CallID,
	}
	if rec, ok := w.answers.get(req.Key); ok {
		// A final record this worker wrote or read a moment ago: no need
		// to ask the ledger again.
		w.m.cacheHits.WithLabelValues(j.env.Tool).Inc()
		return w.replay(j, rec)
	}
	waitUntil := time.Now().Add(w.cfg.MaxWait)
	for {
		c, err := w.ledger.Claim(stop, req)
		if err != nil {
			w.log.Warn("claim", zap.String("key", req.Key), zap.Error(err))
			return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable")
		}
		switch c.Outcome {
		case dedup.Acquired, dedup.TookOver:
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
// that as Conflict, Done otherwise), else the record's outcome, replayed.
func (w *Worker) replay(j *job, rec dedup.Record) verdict {
	if rec.Fingerprint != j.id.Fingerprint {
		w.m.conflicts.WithLabelValues(j.env.Tool).Inc()
	} else {
		w.m.replays.WithLabelValues(j.env.Tool).Inc()
	}
	w.answer(j, w.fromRecord(j, rec, true))
	return ack()
}

// confirmAbandoned watches the key for the takeover grace (one more lease of
// the tool) and reports whether its record moved past rev meanwhile. A live
// holder cut off by an outage reconnects, and extends or records, well within
// it: its heartbeat runs every third of a lease.
func (w *Worker) confirmAbandoned(stop context.Context, j *job, rev uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(stop, j.tool.Lease)
	defer cancel()
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
	halt := w.beats.hold(ctx, j.msg, w.cfg.AckWait/3)
	defer halt()
	rec, _, err := w.ledger.Wait(ctx, j.id.Key)
	return rec, err
}
