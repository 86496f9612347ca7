package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
	"github.com/idemgate/idemgate/pkg/retry"
)

// Submission is one published intent awaiting its answer.
type Submission struct {
	// Key and Fingerprint as the client derived them.
	Key, Fingerprint string
	// Duplicate reports that JetStream dropped the publish as a duplicate of an
	// earlier intent with this key: the answer comes from the ledger.
	Duplicate bool
	// Sequence is the intent's stream sequence (of the original when Duplicate).
	Sequence uint64

	c    *Client
	tool string
	call string
	spec toolSpec
	// decoded is the intent as built, which a relearned key spec derives
	// from again.
	decoded intent.Decoded
	msg     *nats.Msg // as published, for a publish again under a fresh message id
	// relearned: the key spec was asked again after a key_mismatch answer.
	relearned bool
	// retry: the tool has a ledger, so the submission republishes under the
	// retry rule (docs/protocol.md 7.2) until it is answered: its publish may
	// have been a duplicate of an intent that ended without a record, or
	// stored and then lost by a server that persists the work stream
	// asynchronously.
	retry bool
	// own are the stream sequences of the submission's stored publishes
	// (its first, a republish, a relearned one; not a Duplicate's, which
	// names another's message): a pushed answer is the submission's only
	// when its Idem-Intent-Seq is one of them, and a record claimed by one
	// is this call's outcome (7.4).
	own []uint64
	// badText holds, by answer, why a pushed answer's text would be read
	// other than as written (audit.CheckAnswerText), for its receipt check.
	badText sync.Map
	// republished counts the publishes under the retry rule.
	republished int
	// name is the call's (intent.HeaderSubmission): a copy of the call
	// published by another submission (each request of a front door's
	// caller that names the call) finds the call's failure as its own.
	name string
	ch   chan *nats.Msg
	sub  *nats.Subscription
}

// Republished is how often the submission published its intent again under
// the retry rule (docs/protocol.md 7.2). Read it after Wait returns.
func (s *Submission) Republished() int { return s.republished }

// Submit publishes env and waits for its answer until ctx is done. A duplicate
// is an answer (Result.Replayed), not an error; so is a conflict.
func (c *Client) Submit(ctx context.Context, env *intent.Envelope) (*intent.Result, error) {
	s, err := c.Publish(ctx, env)
	if err != nil {
		return nil, err
	}
	return s.Wait(ctx)
}

// Prepared is an intent built, checked and keyed, ready to publish: the
// first half of a submission (Client.Prepare), the second being
// Client.PublishPrepared. It may be published more than once.
type Prepared struct {
	// Decoded is the envelope as built (intent.Build): its canonical args
	// and its encoding, the bytes published.
	intent.Decoded
	// ID is the key and fingerprint, derived as the workers derive them.
	ID intent.Identity
	// Tool is the catalogue's entry for the tool, when Known.
	Tool intent.ToolInfo
	// Known reports whether the workers' catalogue lists the tool.
	Known bool
	// CatalogErr is why the catalogue could not be asked (Known is then
	// false): the key was derived by the default spec.
	CatalogErr error
	// Submission names the call (intent.HeaderSubmission) when a front
	// door publishes one call more than once — a caller's repeats of one
	// request — so that the workers tell a copy of the call from a new one
	// (a failed operation runs again only for a new call). Empty, as
	// Prepare leaves it: each PublishPrepared is a call of its own.
	Submission string

	spec toolSpec
}

// Prepare is the first half of a submission, which every submission goes
// through: it learns env's tool from the catalogue (Tool; a tool keyed by
// time window whose envelope has no created_at gets now), builds the
// envelope under lim — checked by the protocol's rules, its args parsed and
// canonicalized once (intent.Build) — checks those args against the tool's
// schema when the catalogue gives one (argschema.Schemas.Check, as the
// workers check them), and derives its key and fingerprint from them
// (Decoded.Derive). Errors wrap intent.ErrInvalid or intent.ErrTooLarge:
// args that break the schema are refused before anything is published. A
// tool the catalogue does not list is no error here: the workers answer
// unknown_tool.
func (c *Client) Prepare(ctx context.Context, env intent.Envelope, lim intent.Limits) (*Prepared, error) {
	if !intent.ValidTool(env.Tool) {
		return nil, fmt.Errorf("client: %w: tool %q must match [a-z0-9_-]{1,64}", intent.ErrInvalid, env.Tool)
	}
	p := &Prepared{}
	p.spec, p.Tool, p.Known, p.CatalogErr = c.learn(ctx, env.Tool)
	if p.spec.key.Window > 0 && env.CreatedAt.IsZero() {
		env.CreatedAt = time.Now().UTC()
	}
	var err error
	if p.Decoded, err = intent.Build(env, lim); err != nil {
		return nil, err // the caller's input: intent's words, which a front door shows as they are
	}
	if p.Known {
		if err := c.cat.schemas.Check(p.Tool.Schema, p.Decoded); err != nil {
			return nil, err // the caller's args, as the workers would refuse them
		}
	}
	if p.ID, err = p.Derive(p.spec.key, time.Now()); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return p, nil
}

// CheckKeyArgs applies the protocol's key-args rule (intent's
// Decoded.CheckKeyArgs) with the catalogue's class and the key spec p was
// derived by: an error wrapping intent.ErrInvalid when the tool is unsafe
// and a key arg is missing with no key override. The front doors refuse
// such a call before publishing; published, the workers reject it.
func (p *Prepared) CheckKeyArgs() error {
	if !p.Known {
		return nil
	}
	return p.Decoded.CheckKeyArgs(p.Tool.Class, p.spec.key)
}

// publishLimits are what Publish checks an envelope against: the protocol's
// rules, and no size or nesting limit of the client's own (the workers'
// limits decide; a publish over the server's max_payload fails).
var publishLimits = intent.Limits{MaxBytes: math.MaxInt, MaxDepth: intent.MaxCanonicalDepth}

// Publish prepares env (Prepare, under the workers' limits) and publishes
// it (PublishPrepared). For a tool keyed by time window, a missing
// created_at is set to now on env too, so that the client and the workers
// derive the same key.
func (c *Client) Publish(ctx context.Context, env *intent.Envelope) (*Submission, error) {
	p, err := c.Prepare(ctx, *env, publishLimits)
	if err != nil {
		return nil, err
	}
	env.CreatedAt = p.CreatedAt
	return c.PublishPrepared(ctx, p)
}

// PublishPrepared is the second half of a submission: it publishes p's
// envelope as built, with Nats-Msg-Id set to its key, a private reply
// subject, its key and fingerprint, and the name of its call
// (p.Submission, or a new one) in headers, and returns the submission to
// Wait on. Every republish of the submission names the same call. It
// returns an error matching intent.ErrInvalid for a malformed p.Submission.
func (c *Client) PublishPrepared(ctx context.Context, p *Prepared) (*Submission, error) {
	env, ts, id := p.Envelope, p.spec, p.ID
	call := p.Submission
	switch {
	case call == "":
		call = nuid.Next()
	case !intent.ValidSubmission(call):
		return nil, fmt.Errorf("client: %w: submission %q: 8 to 64 characters of [A-Za-z0-9_-]", intent.ErrInvalid, call)
	}
	s := &Submission{Key: id.Key, Fingerprint: id.Fingerprint, c: c, tool: env.Tool, call: env.CallID, spec: ts, decoded: p.Decoded, name: call, ch: make(chan *nats.Msg, inboxBuffer)}
	inbox := c.nc.NewRespInbox()
	var err error
	s.sub, err = c.nc.ChanSubscribe(inbox, s.ch)
	if err != nil {
		return nil, fmt.Errorf("client: subscribe %s: %w", inbox, err)
	}
	s.msg = nats.NewMsg(c.names.IntentSubject(env.Tool))
	s.msg.Data = p.Data()
	s.msg.Header.Set(intent.HeaderReplyTo, inbox)
	s.msg.Header.Set(intent.HeaderKey, id.Key)
	s.msg.Header.Set(intent.HeaderFingerprint, id.Fingerprint)
	s.msg.Header.Set(intent.HeaderSubmission, call)
	injectTrace(ctx, s.msg.Header)
	msgID := ""
	if !ts.noLedger && !ts.retryFailed {
		// Publish dedup answers a repeat from the ledger; a tool without the
		// ledger fires every intent, and one that retries failures runs a
		// failed operation again, so their repeats must reach a worker.
		msgID = id.Key
	}
	ack, err := s.publish(ctx, msgID)
	if err != nil {
		_ = s.sub.Unsubscribe()
		return nil, err
	}
	s.Duplicate, s.Sequence = ack.Duplicate, ack.Sequence
	s.retry = !ts.noLedger
	return s, nil
}

// inboxBuffer is how many pushed messages a submission's inbox holds while
// it is not read (during a publish under the retry rule, whose answer may
// come before its PubAck): past it, NATS drops them, and the ledger answers.
const inboxBuffer = 64

// publish publishes the submission's intent under message id msgID (none
// when empty) and notes a stored publish's sequence as the submission's own.
func (s *Submission) publish(ctx context.Context, msgID string) (*jetstream.PubAck, error) {
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ack, err := s.c.publish(ctx, s.msg, opts...)
	if err != nil {
		return nil, fmt.Errorf("client: publish %s: %w", s.msg.Subject, err)
	}
	if !ack.Duplicate {
		s.own = append(s.own, ack.Sequence)
	}
	return ack, nil
}

// owns reports whether seq is the stream sequence of one of the
// submission's stored publishes.
func (s *Submission) owns(seq uint64) bool { return seq != 0 && slices.Contains(s.own, seq) }

// errCodeMsgIDInProcess is JetStream's answer to a publish whose Nats-Msg-Id
// another publish is storing right now (seen on replicated streams with
// concurrent copies): the copy is a duplicate, only not yet known as one.
const errCodeMsgIDInProcess = 10158

// publish publishes msg, and publishes it again after a short pause while
// JetStream answers that a publish with the same Nats-Msg-Id is in process:
// the retry is then acknowledged as a duplicate.
func (c *Client) publish(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	pauses := retry.Doubling(ctx, 5*time.Millisecond, 500*time.Millisecond)
	for {
		ack, err := c.js.PublishMsg(ctx, msg, opts...)
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeMsgIDInProcess {
			return ack, err
		}
		if !retry.Wait(ctx, pauses) {
			return nil, err
		}
	}
}

// Wait returns the submission's answer: the pushed reply, or — when the
// publish was a duplicate or no reply came within the grace period — the
// record read from the ledger key (watched only while no record answers
// yet: a watch is a subscription and leader reads, see
// dedup.Ledger.WaitFor; the client creates no consumer). A pushed reply counts only
// when it is bound to one of the submission's own stored publishes (its
// Idem-Intent-Seq header, docs/protocol.md 7.1); every other message on the
// inbox is dropped. A ledger record with another fingerprint is answered as
// a conflict (publish dedup hides a conflict from the workers). An intent
// unanswered whose key shows no record that will answer — a duplicate of
// one that ended without a record, or one a server crash lost after
// acknowledging it — is published again under a fresh message id after the
// grace, then after twice the grace, and so on (7.2). Wait returns at the first answer, awaiting_approval and uncertain
// included; WaitFinal goes on to the final one. It returns ErrNoAnswer when
// ctx ends first. With WithReceiptKeys, an answer whose receipt does not
// verify is returned with an error matching ErrBadReceipt.
func (s *Submission) Wait(ctx context.Context) (*intent.Result, error) {
	return s.verified(s.wait(ctx, false))
}

// WaitFinal is Wait that goes on past awaiting_approval and uncertain
// answers, watching the ledger, until the operation's final answer
// (completed, failed, denied, conflict, rejected).
func (s *Submission) WaitFinal(ctx context.Context) (*intent.Result, error) {
	return s.verified(s.wait(ctx, true))
}

// verified checks the receipt of an answer wait returned, and that an
// answer that is not a replay names a run one of the submission's own
// publishes started: a run's whole answer, receipt and all, replayed to a
// caller of a later run of its key verifies but for that.
func (s *Submission) verified(res *intent.Result, err error) (*intent.Result, error) {
	if err != nil {
		return res, err
	}
	if bad, ok := s.badText.Load(res); ok && s.c.checksReceipt(res) {
		return res, fmt.Errorf("%w: %w", ErrBadReceipt, bad.(error))
	}
	if err := s.c.checkReceipt(res); err != nil {
		return res, err
	}
	if s.c.checksReceipt(res) && !res.Replayed && !s.owns(res.IntentSeq) {
		return res, fmt.Errorf("%w: %w: the answer is not a replay, yet its run (intent_seq %d) is none of this call's publishes: another run's answer",
			ErrBadReceipt, audit.ErrReceiptMismatch, res.IntentSeq)
	}
	return res, nil
}

func (s *Submission) wait(ctx context.Context, final bool) (*intent.Result, error) {
	defer func() { _ = s.sub.Unsubscribe() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the ledger watch
	enough := func(st intent.Status) bool { return st.Final() || (!final && st.Answered()) }
	// fromLedger delivers the first record that answers, once the key is
	// watched: a watch subscribes and reads the stream leader, so it
	// starts only when the pushed reply is not enough.
	var fromLedger chan ledgerAnswer
	stopWatch := func() {}
	watchLedger := func() {
		if fromLedger != nil || s.spec.noLedger {
			return
		}
		wctx, stop := context.WithCancel(ctx)
		ch := make(chan ledgerAnswer, 1)
		fromLedger, stopWatch = ch, stop
		key, fp := s.Key, s.Fingerprint // the watch must not read what relearn changes
		own, retryFailed, name := slices.Clone(s.own), s.spec.retryFailed, s.name
		go func() {
			rec, err := s.c.waitLedger(wctx, key, func(rec dedup.Record) bool {
				if retryFailed && rec.Status == intent.StatusFailed && !slices.Contains(own, rec.IntentSeq) && !rec.CausedBy(0, name) {
					return false // an earlier call's failure: this call runs it again
				}
				return enough(recordStatus(rec, fp))
			})
			ch <- ledgerAnswer{rec, err}
		}()
	}
	defer func() { stopWatch() }()
	if s.Duplicate {
		watchLedger()
	}
	replied := false // an answer bound to this submission came: no more republishing
	grace := s.c.grace
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		select {
		case m := <-s.ch:
			res, ok := s.pushed(m)
			if !ok {
				continue // not this submission's: the reply subject is no proof of identity
			}
			if res.Status == intent.StatusRejected && res.Error != nil && res.Error.Code == intent.CodeKeyMismatch && !s.relearned && s.spec.learned {
				// The tool's key spec changed since the catalogue was asked:
				// ask again and send the intent under the workers' key.
				stopWatch() // of the old key
				fromLedger = nil
				if err := s.relearn(ctx); err != nil {
					return nil, err
				}
				if s.Duplicate {
					watchLedger()
				}
				continue
			}
			replied = true
			if enough(res.Status) {
				return res, nil
			}
			watchLedger() // the final answer comes from the ledger
		case <-timer.C:
			watchLedger()
			if s.retry && !replied {
				// A duplicate names an intent that may have ended without
				// a record (rate limited, dead-lettered), and so may a
				// republished copy whose reply was lost: a copy dedup
				// swallowed would never be answered. A stored publish may
				// have been lost by a server crash after its acknowledgement
				// (a work stream persisted asynchronously): nothing but a
				// copy would ever reach a worker.
				s.republishIfUnrecorded(ctx)
			}
			grace *= 2
			timer.Reset(grace)
		case a := <-fromLedger:
			if a.err != nil {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("%w for %s: %w", ErrNoAnswer, s.Key, ctx.Err())
				}
				return nil, fmt.Errorf("client: %w", a.err)
			}
			return s.fromRecord(a.rec), nil
		case <-ctx.Done():
			return nil, fmt.Errorf("%w for %s: %w", ErrNoAnswer, s.Key, ctx.Err())
		}
	}
}

// pushed decodes m, a message on the submission's inbox, and reports
// whether it answers this submission (docs/protocol.md 7.1): its
// Idem-Intent-Seq header names one of the submission's own stored
// publishes, and, unless it is a rejection (which a worker may give before
// it could derive a key), its key is the submission's and its fingerprint,
// when it has one, too; an answer that is not a replay names the run of one
// of the submission's publishes (its intent_seq, when it has one), never
// another run's (a copy of the call published by another submission is
// answered from the ledger). Anyone who learns the inbox can name it as the
// reply subject of an intent of their own; the sequence a worker answers
// with is that intent's, never this submission's.
func (s *Submission) pushed(m *nats.Msg) (*intent.Result, bool) {
	seq, err := strconv.ParseUint(m.Header.Get(intent.HeaderIntentSeq), 10, 64)
	if err != nil || !s.owns(seq) {
		return nil, false
	}
	var res intent.Result
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return nil, false
	}
	if res.Status != intent.StatusRejected && (res.Key != s.Key || (res.Fingerprint != "" && res.Fingerprint != s.Fingerprint)) {
		return nil, false
	}
	if !res.Replayed && res.IntentSeq != 0 && res.IntentSeq != seq && !s.owns(res.IntentSeq) {
		return nil, false // not a replay, yet of a run none of this call's publishes made: another run's answer
	}
	if s.c.receiptKeys != nil {
		if err := audit.CheckAnswerText(m.Data); err != nil {
			s.badText.Store(&res, err)
		}
	}
	return &res, true
}

// recordStatus is the status of the answer a record gives a caller whose
// intent has fingerprint fp: conflict when the record's is another (a
// forgotten record answers nobody: the key is free).
func recordStatus(rec dedup.Record, fp string) intent.Status {
	if rec.Status != intent.StatusForgotten && rec.Fingerprint != fp {
		return intent.StatusConflict
	}
	return rec.Status
}

// relearn asks the catalogue for the tool's key spec again, derives the
// intent's key under it and publishes the intent again, once. The
// submission's earlier publishes were under the stale key: their sequences
// no longer answer it.
func (s *Submission) relearn(ctx context.Context) error {
	s.relearned = true
	s.spec = s.c.relearnSpec(ctx, s.tool)
	id, err := s.decoded.Derive(s.spec.key, time.Now())
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	s.Key, s.Fingerprint = id.Key, id.Fingerprint
	s.msg.Header.Set(intent.HeaderKey, id.Key)
	s.msg.Header.Set(intent.HeaderFingerprint, id.Fingerprint)
	msgID := ""
	if !s.spec.noLedger && !s.spec.retryFailed {
		msgID = id.Key
	}
	s.own = nil
	ack, err := s.publish(ctx, msgID)
	if err != nil {
		return err
	}
	s.Duplicate, s.Sequence = ack.Duplicate, ack.Sequence
	s.retry = !s.spec.noLedger
	return nil
}

// republishIfUnrecorded publishes the intent again under a fresh message id
// when the ledger shows nothing that will answer it: no record, a forgotten
// one, a pending one whose holder's lease ran out a lease ago (its intent is
// gone; the workers confirm the holder gone before they take it over), or,
// for a tool that runs a failed operation again, an earlier call's failure.
// Neither publish dedup nor a lost intent may make an operation
// un-retryable: the ledger is the guarantee. A ledger or a server it cannot
// reach now is tried again at the next grace (a lasting error ends the
// ledger's watch, and with it the wait).
func (s *Submission) republishIfUnrecorded(ctx context.Context) {
	rec, err := s.c.get(ctx, s.Key)
	switch {
	case errors.Is(err, dedup.ErrNotFound):
	case err != nil:
		return
	case rec.Status == intent.StatusPending && rec.LeaseExpired(time.Now().Add(-s.spec.lease())):
	case rec.Status == intent.StatusForgotten: // forgotten: the next intent runs it again
	case s.spec.retryFailed && rec.Status == intent.StatusFailed && !s.owns(rec.IntentSeq):
	default:
		return
	}
	if _, err := s.publish(ctx, s.Key+":"+nuid.Next()); err == nil {
		s.republished++
	}
}

// fromRecord is the answer a ledger record gives this submission: a
// conflict when its fingerprint is not the submission's (publish dedup
// hides a conflict from the workers), a replay unless one of the
// submission's own publishes claimed it (7.4).
func (s *Submission) fromRecord(rec dedup.Record) *intent.Result {
	res := rec.Answer(dedup.Caller{Key: s.Key, Fingerprint: s.Fingerprint, Tool: s.tool, CallID: s.call, RejectRepeat: s.spec.rejectRepeat},
		!s.owns(rec.IntentSeq))
	return &res
}
