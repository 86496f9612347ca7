package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// auditor writes the worker's audit trail (pkg/audit, docs/audit.md):
// each event where it happens, through a trail that never blocks an
// operation, and the receipt of every final outcome the worker records.
type auditor struct {
	// signer signs receipts, those made at once together (one signature
	// for them all: see audit.SignBatch).
	signer *audit.BatchSigner
	trail  *audit.Trail // nil: no trail (Config.DisableTrail), receipts only
	// key signs checkpoints of the installation's chains.
	key *audit.Signer
	// installation is the installation's id, read on first use; the
	// checkpoints made last, and when (all under cpMu).
	cpMu         sync.Mutex
	installation string
	cps          []audit.Checkpoint
	cpAt         time.Time
	parts        int
	holder       string
	names        intent.Names
	log          *zap.Logger
}

// newAuditor loads (or makes) the worker's signing key, which is all its
// receipts need; start publishes its public key and builds the trail.
func newAuditor(cfg Config, log *zap.Logger) (*auditor, error) {
	var signer *audit.Signer
	var err error
	if cfg.AuditKey == "" {
		signer, err = audit.GenerateSigner()
	} else {
		var created bool
		signer, created, err = audit.LoadOrCreateSigner(cfg.AuditKey)
		if err != nil && !errors.Is(err, audit.ErrInvalid) {
			err = fmt.Errorf("%w: make the audit key's directory writable, or give an existing Ed25519 key (cmd/worker --audit-key; openssl genpkey -algorithm ed25519)", err)
		}
		if created {
			log.Info("made an audit signing key: publish its public key (submit audit keys) for auditors",
				zap.String("file", cfg.AuditKey), zap.String("key_id", signer.ID()))
		}
	}
	if err != nil {
		return nil, err
	}
	return &auditor{signer: audit.NewBatchSigner(signer), key: signer, holder: cfg.Holder, log: log}, nil
}

// start publishes the auditor's public key and builds its trail, over
// res's ledger's partitions; Run starts the trail.
func (a *auditor) start(ctx context.Context, res *resources, cfg Config) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := audit.PublishKey(pctx, res.js, res.names, a.key.Public(cfg.Holder, time.Now().Add(-time.Minute))); err != nil {
		// Verification without a keys file will not know this key; the
		// trail and the receipts are signed all the same.
		a.log.Warn("could not publish the audit key", zap.String("key_id", a.key.ID()), zap.Error(err))
	}
	a.parts, a.names = res.partitions, res.names
	if cfg.DisableTrail {
		return nil
	}
	var err error
	a.trail, err = audit.NewTrail(res.js, audit.TrailConfig{Names: res.names, Partitions: res.partitions, Signer: a.key,
		Holder: cfg.Holder, Queue: cfg.AuditQueue, Log: a.log.Sugar()})
	return err
}

func (a *auditor) partition(key string) int { return intent.Partition(key, a.parts) }

// trailing reports whether the worker writes a trail.
func (a *auditor) trailing() bool { return a != nil && a.trail != nil }

// auditCounts are the trail's counts and the receipts signed.
type auditCounts struct {
	trail                audit.TrailStats
	receipts, signatures uint64
}

// stats are the auditor's counts (zero without one).
func (a *auditor) stats() auditCounts {
	if a == nil {
		return auditCounts{}
	}
	var c auditCounts
	if a.trail != nil {
		c.trail = a.trail.Stats()
	}
	c.receipts, c.signatures = a.signer.Stats()
	return c
}

// receiptCapture collects the receipt a ledger write signed, for a caller
// that must tell a write it made from a record it found (a decision that
// changed nothing).
type receiptCapture struct{ raw json.RawMessage }

type receiptCaptureKey struct{}

func captureReceipt(ctx context.Context) (context.Context, *receiptCapture) {
	c := &receiptCapture{}
	return context.WithValue(ctx, receiptCaptureKey{}, c), c
}

// receipt is the ledger's dedup.ReceiptFunc: ev, the outcome event of a
// record about to be written final, signed.
func (a *auditor) receipt(ctx context.Context, ev audit.Event) (json.RawMessage, audit.Signature) {
	signed, sig := a.signer.SignSealed(ev)
	if c, ok := ctx.Value(receiptCaptureKey{}).(*receiptCapture); ok {
		c.raw = signed
	}
	return signed, sig
}

// claimed records a claim the worker won: a takeover (confirmed: after the
// grace) or a claim. A claim that fires at once is not recorded here: its
// fired event records both (claimEvent, fired).
func (a *auditor) claimed(j *job, c dedup.ClaimResult, confirmed bool) {
	if !a.trailing() {
		return
	}
	a.trail.Append(a.partition(j.id.Key), a.claimEvent(j, c, confirmed))
}

// claimEvent is the event of a claim the worker won: a takeover (confirmed:
// after the grace) or a claim.
func (a *auditor) claimEvent(j *job, c dedup.ClaimResult, confirmed bool) audit.Event {
	rec := c.Record
	ev := audit.Event{Kind: audit.KindClaimed, Key: j.id.Key, Tool: j.env.Tool, Session: j.env.Session, Fingerprint: j.id.Fingerprint,
		Holder: a.holder, Attempt: rec.Attempt, IntentSeq: j.seq, At: time.Now()}
	if c.Outcome == dedup.TookOver {
		ev.Kind, ev.PreviousHolder, ev.PreviousAttempt, ev.Reason = audit.KindTakeover, c.Previous.Holder, c.Previous.Attempt, audit.ReasonLeaseExpired
		if confirmed {
			ev.Reason = audit.ReasonConfirmedAbandoned
		}
	} else {
		ev.ArgsDigest = audit.Digest(j.env.Args) // canonical once decoded
		if j.tool.AuditArgs {
			ev.Args = j.env.Args
		}
	}
	return ev
}

// fired records the holder handing the operation to its effect; claimed,
// when the holder fires at once on its claim, is that claim's event
// (claimEvent), which the fired event then records too: the claim's
// members in one event of kind fired, instead of two events.
func (a *auditor) fired(j *job, lease lease, claimed *audit.Event) {
	if !a.trailing() {
		return
	}
	rec := lease.Record()
	ev := audit.Event{Key: j.id.Key, Holder: a.holder}
	if claimed != nil {
		ev = *claimed
	}
	ev.Kind, ev.Attempt, ev.Effect, ev.At = audit.KindFired, rec.Attempt, j.tool.Kind, time.Now()
	switch e := j.tool.Effect.(type) {
	case upstreamEffect:
		ev.Destination = e.Upstream().String() + " " + e.UpstreamTool()
	case messageIDEffect:
		ev.ForwardedKey = e.MessageID(j.env.Tool, j.id.Key)
	}
	a.trail.Append(a.partition(j.id.Key), ev)
}

// messageIDEffect is an effect that forwards the key as a message id of its
// own making (the smtp kind's Message-ID), which the trail records.
type messageIDEffect interface {
	MessageID(tool, key string) string
}

// released records a transient failure that gave the key back.
func (a *auditor) released(j *job, attempts int, cause error) {
	if !a.trailing() {
		return
	}
	ev := audit.Event{Kind: audit.KindReleased, Key: j.id.Key, Holder: a.holder, Attempts: attempts, At: time.Now()}
	if cause != nil {
		e := intent.Error{Code: "transient", Message: cause.Error()}
		ev.ErrorCode, ev.ErrorDigest = e.Code, audit.ErrorDigest(e)
	}
	a.trail.Append(a.partition(j.id.Key), ev)
}

// recorded records an outcome the worker wrote: its receipt, when final;
// else (awaiting approval, uncertain) an unsigned outcome event.
func (a *auditor) recorded(key string, rec dedup.Record) {
	if !a.trailing() {
		return
	}
	if rec.Status.Final() {
		a.trail.AppendSigned(a.partition(key), rec.Receipt)
		return
	}
	ev := audit.Outcome(key, rec.Tool, rec.Session, rec.Fingerprint, rec.Status, rec.Result, rec.Error, rec.Attempts, rec.IntentSeq, rec.UpdatedAt)
	ev.Holder, ev.Attempt = a.holder, rec.Attempt
	a.trail.Append(a.partition(key), ev)
}

// conflict signs the conflict answer res (its receipt) and records it;
// the receipt binds res's time and intent sequence, the refused intent's
// (set in res).
func (a *auditor) conflict(j *job, res *intent.Result) json.RawMessage {
	if a == nil {
		return nil
	}
	res.IntentSeq = j.seq
	ev := audit.Event{Kind: audit.KindConflict, Key: res.Key, Tool: res.Tool, Fingerprint: res.Fingerprint,
		RecordFingerprint: res.RecordFingerprint, Status: intent.StatusConflict, Holder: a.holder, IntentSeq: j.seq, At: res.CompletedAt}
	if j.env != nil {
		ev.Session = j.env.Session
	}
	if res.Error != nil {
		ev.ErrorCode, ev.ErrorDigest = res.Error.Code, audit.ErrorDigest(*res.Error)
	}
	signed := a.signer.Sign(ev)
	if a.trail != nil {
		a.trail.AppendSigned(a.partition(res.Key), signed)
	}
	return signed
}

// decided records an operator's decision that applied, with the status it
// left, and the receipt of the outcome it wrote (captured; a decision that
// found its outcome written already wrote none).
func (a *auditor) decided(op string, c intent.Control, rec dedup.Record, wrote *receiptCapture) {
	if !a.trailing() {
		return
	}
	ev := audit.Event{Kind: audit.KindDecision, Key: c.Key, Tool: rec.Tool, Session: rec.Session, Fingerprint: rec.Fingerprint,
		Status: rec.Status, Op: op, By: c.By, Reason: c.Reason, Holder: a.holder, At: time.Now()}
	p := a.partition(c.Key)
	a.trail.Append(p, ev)
	if wrote != nil && len(wrote.raw) > 0 && bytes.Equal(wrote.raw, rec.Receipt) {
		a.trail.AppendSigned(p, rec.Receipt)
	}
}

// serveForgotten subscribes to Names.ForgetSubject in a queue group, so
// that one worker records each forget an operator announces there (the
// forgotten record's fingerprint, by and reason in the message's headers):
// once the key's record is forgotten in the ledger (a forgotten record of
// that fingerprint, whose by and reason are recorded), or gone.
func (w *Worker) serveForgotten() (*nats.Subscription, error) {
	subject := w.res.names.ForgetSubject()
	sub, err := w.nc.QueueSubscribe(subject, w.res.names.Consumer+"_AUDIT", func(m *nats.Msg) {
		key, fp := string(m.Data), m.Header.Get(audit.HeaderFingerprint)
		if key == "" || fp == "" {
			return // no record was deleted
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		by, reason := m.Header.Get(audit.HeaderBy), m.Header.Get(audit.HeaderReason)
		rec, _, err := w.ledger.Get(ctx, key)
		switch {
		case errors.Is(err, dedup.ErrNotFound): // gone: deleted, or its forgotten record expired
		case err == nil && rec.Status == intent.StatusForgotten && rec.Fingerprint == fp && rec.Decision != nil:
			by, reason = rec.Decision.By, rec.Decision.Reason // the ledger's word, not the announcement's
		default:
			// The record is there (or cannot be read): no forget to record.
			w.log.Debug("forget announced, but the record is there; not recorded", zap.String("key", key), zap.Error(err))
			return
		}
		w.audit.trail.Append(w.audit.partition(key), audit.Event{Kind: audit.KindForgotten, Key: key, Fingerprint: fp, Holder: w.audit.holder,
			By: by, Reason: reason, At: time.Now()})
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return sub, nil
}

// checkpointReuse is how long checkpoints made answer requests for fresh
// ones: requests more frequent than that cost no more work.
const checkpointReuse = time.Second

// checkpoints signs a checkpoint of every partition's chain and stores
// them (audit.StoreCheckpoints); within checkpointReuse of the last ones,
// it returns those.
func (a *auditor) checkpoints(ctx context.Context, js jetstream.JetStream) ([]audit.Checkpoint, error) {
	a.cpMu.Lock()
	defer a.cpMu.Unlock()
	if time.Since(a.cpAt) < checkpointReuse {
		return a.cps, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if a.installation == "" {
		id, err := audit.Installation(ctx, js, a.names)
		if err != nil {
			return nil, err
		}
		a.installation = id
	}
	cps, err := audit.MakeCheckpoints(ctx, js, a.names, a.installation, a.parts, a.key)
	if err != nil {
		return nil, err
	}
	if err := audit.StoreCheckpoints(ctx, js, a.names, cps); err != nil {
		return nil, err
	}
	a.cps, a.cpAt = cps, time.Now()
	return cps, nil
}

// checkpointEvery stores the checkpoints at once and then every period,
// until ctx ends.
func (w *Worker) checkpointEvery(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if _, err := w.audit.checkpoints(ctx, w.res.js); err != nil && ctx.Err() == nil {
			w.log.Warn("audit checkpoint not stored", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serveCheckpoints answers requests on audit.CheckpointSubject, in a queue
// group, with fresh checkpoints (stored too).
func (w *Worker) serveCheckpoints() (*nats.Subscription, error) {
	subject := audit.CheckpointSubject(w.res.names)
	sub, err := w.nc.QueueSubscribe(subject, w.res.names.Consumer+"_CHECKPOINT", func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		reply := nats.NewMsg(m.Reply)
		cps, err := w.audit.checkpoints(context.Background(), w.res.js)
		if err != nil {
			w.log.Warn("audit checkpoint asked for, not made", zap.Error(err))
			reply.Header.Set("Idem-Error", err.Error())
		} else {
			reply.Data = audit.MarshalCheckpoints(cps)
		}
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return sub, nil
}

// The trail's counters (audit.TrailStats), read at scrape time.
var (
	auditAppendedDesc = prometheus.NewDesc("idemgate_audit_events_total", "Audit events written to the trail.", nil, nil)
	auditDroppedDesc  = prometheus.NewDesc("idemgate_audit_dropped_total",
		"Audit events dropped (the trail unreachable and its queue full, or the worker stopping): the trail shows a gap entry for them.", nil, nil)
	auditMovedDesc = prometheus.NewDesc("idemgate_audit_appends_moved_total",
		"Audit appends built again because another worker appended to the same partition first.", nil, nil)
	auditQueuedDesc   = prometheus.NewDesc("idemgate_audit_queued", "Audit events in memory, waiting to be written.", nil, nil)
	auditReceiptsDesc = prometheus.NewDesc("idemgate_audit_receipts_total", "Receipts signed (final outcomes and conflicts).", nil, nil)
	auditSigsDesc     = prometheus.NewDesc("idemgate_audit_receipt_signatures_total",
		"Signatures made for receipts: receipts made at once share one (over idemgate_audit_receipts_total, the receipts per signature).", nil, nil)
)

// auditCollector exports the trail's counts.
type auditCollector struct{ m *Metrics }

func (c auditCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{auditAppendedDesc, auditDroppedDesc, auditMovedDesc, auditQueuedDesc, auditReceiptsDesc, auditSigsDesc} {
		ch <- d
	}
}

func (c auditCollector) Collect(ch chan<- prometheus.Metric) {
	var c2 auditCounts
	if f := c.m.auditStats.Load(); f != nil {
		c2 = (*f)()
	}
	st := c2.trail
	ch <- prometheus.MustNewConstMetric(auditAppendedDesc, prometheus.CounterValue, float64(st.Appended))
	ch <- prometheus.MustNewConstMetric(auditDroppedDesc, prometheus.CounterValue, float64(st.Dropped))
	ch <- prometheus.MustNewConstMetric(auditMovedDesc, prometheus.CounterValue, float64(st.Moved))
	ch <- prometheus.MustNewConstMetric(auditQueuedDesc, prometheus.GaugeValue, float64(st.Queued))
	ch <- prometheus.MustNewConstMetric(auditReceiptsDesc, prometheus.CounterValue, float64(c2.receipts))
	ch <- prometheus.MustNewConstMetric(auditSigsDesc, prometheus.CounterValue, float64(c2.signatures))
}

// auditFlush bounds how long a stopping worker writes the audit events
// still queued; what is left then is dropped (and counted).
const auditFlush = 10 * time.Second

// closeTrail writes what the trail holds, within auditFlush.
func (w *Worker) closeTrail() {
	ctx, cancel := context.WithTimeout(context.Background(), auditFlush)
	defer cancel()
	before := w.audit.trail.Stats().Dropped
	w.audit.trail.Close(ctx)
	if lost := w.audit.trail.Stats().Dropped - before; lost > 0 {
		w.log.Warn("audit events not written before the worker stopped", zap.Uint64("dropped", lost))
	}
	// A last checkpoint, of what it wrote.
	w.audit.cpMu.Lock()
	w.audit.cpAt = time.Time{}
	w.audit.cpMu.Unlock()
	if _, err := w.audit.checkpoints(ctx, w.res.js); err != nil {
		w.log.Warn("audit checkpoint not stored", zap.Error(err))
	}
}
