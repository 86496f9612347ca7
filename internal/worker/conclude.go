package worker

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/retry"
)

// conclude records what f's effect returned under its lease, by
// compare-and-set on the lease's revision: a result, or a permanent failure
// (a transient one at the last delivery too), written and answered; a
// transient failure gives the key back for a retry. A lease lost before the
// record is the new holder's to record: its outcome answers.
func (w *Worker) conclude(f *firing) handled {
	j := f.j
	o := w.outcomeOf(j, f.out.Result, f.err)
	w.obs.effected(f, o)
	attempts := f.lease.Record().Attempts + f.out.Invocations

	var write func(context.Context) (dedup.Record, error)
	switch o.kind {
	case outcomeDone:
		write = func(ctx context.Context) (dedup.Record, error) { return f.lease.Complete(ctx, o.result, attempts) }
	case outcomeFailed:
		write = func(ctx context.Context) (dedup.Record, error) { return f.lease.Fail(ctx, o.err, attempts) }
	default:
		w.log.Info("effect failed transiently; releasing the key", zap.String("key", j.id.Key), zap.Error(o.cause))
		if err := f.lease.Release(f.work, attempts); err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
			w.log.Warn("release", zap.String("key", j.id.Key), zap.Error(err))
		}
		w.obs.released(j, attempts, o.cause)
		return unanswered(nak(w.retryDelay(j.meta.NumDelivered), "effect failed transiently"))
	}
	rec, err := w.record(f.work, j, write)
	w.obs.concluded(f, err)
	switch {
	case err == nil:
		w.remember(j, rec)
		return answered(w.fromRecord(j, rec, false), ack())
	case errors.Is(err, dedup.ErrLeaseLost):
		// Another worker took the key over: never overwrite its record, answer
		// with its outcome once there is one.
		w.log.Warn("lease lost before recording; answering with the holder's outcome", zap.String("key", j.id.Key))
		rec, werr := w.await(f.stop, j, time.Now().Add(w.cfg.MaxWait))
		if werr == nil && rec.Status.Answered() {
			return answered(w.fromRecord(j, rec, !rec.CausedBy(j.seq, j.submission)), ack())
		}
		return unanswered(requeue(w.cfg.RetryDelay, "lease lost; outcome not recorded yet"))
	default:
		// The worker stopped (its drain is over) before the outcome could be
		// recorded: the lease will expire and the key be taken over (the
		// crash window; the forwarded key lets a keyed downstream absorb the
		// repeat).
		w.log.Error("outcome not recorded: the worker stopped before the ledger took it", zap.String("key", j.id.Key), zap.Error(err))
		return unanswered(nak(w.retryDelay(j.meta.NumDelivered), "outcome not recorded"))
	}
}

// record writes an outcome with a lease's write (a completion, a failure,
// a hold for an operator) and puts it on the audit trail, trying again for
// as long as the ledger cannot be reached: a holder that knows its outcome
// keeps it until it is recorded, the lease is lost (another claimant took
// over: dedup.ErrLeaseLost), or ctx ends (the worker's drain is over).
// Meanwhile j's heartbeat holds the message and extends the lease. Each try
// gets a quarter of the lease: a try whose reply was lost to a server
// restart must not hold the lease's writes (its heartbeat among them) for
// the client's whole request timeout, or another worker would confirm the
// holder gone.
func (w *Worker) record(ctx context.Context, j *job, write func(context.Context) (dedup.Record, error)) (dedup.Record, error) {
	per := min(max(j.tool.Lease/4, 250*time.Millisecond), 5*time.Second)
	pauses := retry.Doubling(ctx, 50*time.Millisecond, 500*time.Millisecond)
	var since, logged time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, per)
		rec, err := write(actx)
		cancel()
		switch {
		case err == nil:
			if !since.IsZero() {
				w.log.Info("outcome recorded after the ledger came back", zap.String("key", j.id.Key), zap.Duration("after", time.Since(since)))
			}
			w.obs.recorded(j.id.Key, rec)
			return rec, nil
		case errors.Is(err, dedup.ErrLeaseLost), errors.Is(err, dedup.ErrLeaseDone), errors.Is(err, dedup.ErrInvalid), ctx.Err() != nil:
			return rec, err
		}
		now := time.Now()
		if since.IsZero() {
			since = now
			j.detach() // the ledger is out: this may take a while
		}
		if now.Sub(logged) >= time.Minute {
			logged = now
			w.log.Warn("ledger unreachable; keeping the outcome until it can be recorded", zap.String("key", j.id.Key),
				zap.Duration("for", now.Sub(since)), zap.Error(err))
		}
		if !retry.Wait(ctx, pauses) {
			return rec, err
		}
	}
}
