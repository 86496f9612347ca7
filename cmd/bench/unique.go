package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/internal/worker"
)

// uniqueAndDup runs N unique intents through the workers (unique), then the
// same N again as duplicates (dup: published without Nats-Msg-Id, so that
// every one reaches a worker and is answered as a replay, from the workers'
// answer cache while it holds the records), then once more through workers
// without the answer cache (dup-ledger: every duplicate is answered from the
// ledger).
func (b *bench) uniqueAndDup(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	names := dupNames{unique: "unique", dup: "dup", ledger: "dup-ledger"}
	if !b.cfg.wants("dup") {
		names.dup, names.ledger = "", ""
	}
	return b.runUnique(ctx, e, b.cfg.N, names)
}

// dupLarge is uniqueAndDup's unique row at each of DupLargeN intents, each
// on a fresh server, and the dup row at the first: more records than the
// answer cache keeps for its age limit, and a ledger that holds a long day's
// operations. Each size is bounded by the scenario timeout scaled to its
// share of N.
func (b *bench) dupLarge(ctx context.Context) error {
	for i, n := range b.cfg.DupLargeN {
		names := dupNames{unique: fmt.Sprintf("unique@%d", n)}
		if i == 0 {
			names.dup = fmt.Sprintf("dup@%d", n)
		}
		if err := b.dupLargeAt(ctx, n, names); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) dupLargeAt(ctx context.Context, n int, names dupNames) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout*time.Duration(max(1, n/max(1, b.cfg.N))))
	defer cancel()
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	return b.runUniqueWith(ctx, e, n, names, b.defaultOpts(e), "unique")
}

// dupNames name the rows of runUnique; an empty name skips its row.
type dupNames struct{ unique, dup, ledger string }

// runUnique measures n unique intents on e, then their duplicates (through
// the answer cache, then, when names.ledger is set, through workers without
// it), adding a row each.
func (b *bench) runUnique(ctx context.Context, e *env, n int, names dupNames) error {
	return b.runUniqueWith(ctx, e, n, names, b.defaultOpts(e), "baseline")
}

// auditCost measures the unique row's intents with the trail off but
// receipts on (unique-no-trail), then with both off (unique-no-audit),
// each on a fresh store: against the unique row (both on, as a worker
// runs), what the trail and the receipts each cost per operation.
func (b *bench) auditCost(ctx context.Context) error {
	for _, v := range []struct {
		name             string
		noTrail, noAudit bool
	}{{"unique-no-trail", true, false}, {"unique-no-audit", false, true}} {
		e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
		if err != nil {
			return err
		}
		o := b.defaultOpts(e)
		o.noTrail, o.noAudit = v.noTrail, v.noAudit
		err = b.runUniqueWith(ctx, e, b.cfg.N, dupNames{unique: v.name}, o, "unique")
		e.close()
		if err != nil {
			return err
		}
	}
	return nil
}

// runUniqueWith is runUnique with the workers' options o; the unique row
// is compared with row ref.
func (b *bench) runUniqueWith(ctx context.Context, e *env, n int, names dupNames, o workerOpts, ref string) error {
	r, err := b.prepare(ctx, e, names.unique, n, b.cfg.Inflight, o)
	if err != nil {
		return err
	}
	g := r.g
	defer func() { _ = g.stop() }()
	var checks []verify
	pass := func(name, ref, what string, msgID, replayed bool) error {
		runs := g.expectRuns(r.keys)
		var took time.Duration
		var a *answers
		cpu, err := b.measure(name, func() error {
			var err error
			took, _, a, err = r.p.closedLoop(ctx, idemBatch(g.names, r.data, r.keys, msgID), b.cfg.Inflight, expect(replayed))
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		want, detail := int32(1), g.auditDetail()
		if replayed {
			want, detail = 0, ""
		}
		checks = append(checks, verify{name: name, runs: runs, want: want, a: a})
		b.add(row{name: name, ops: float64(n) / took.Seconds(), cpu: cpu / time.Duration(n), ref: ref,
			detail: fmt.Sprintf("%d %s in %s", n, what, took.Round(time.Millisecond)) + detail})
		return nil
	}
	if err := pass(names.unique, ref, "intents", true, false); err != nil {
		return err
	}
	if names.dup != "" {
		if err := pass(names.dup, names.unique, "replays (no Nats-Msg-Id; answer cache on)", false, true); err != nil {
			return err
		}
	}
	if names.ledger != "" {
		// The same duplicates through workers that read every one from the
		// ledger.
		if err := g.stop(); err != nil {
			return err
		}
		o.answerCache = worker.NoAnswerCache
		if g, err = b.startWorkers(ctx, e, o); err != nil {
			return err
		}
		if err := pass(names.ledger, names.unique, "replays (no Nats-Msg-Id; answer cache off)", false, true); err != nil {
			return err
		}
	}
	if err := g.stop(); err != nil {
		return err
	}
	return verifyAll(r.p, checks)
}
