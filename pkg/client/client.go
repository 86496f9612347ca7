package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Errors returned by the client.
var (
	// ErrNoAnswer: the context ended before an answer arrived. The operation
	// may still complete; Watch its key to learn the outcome.
	ErrNoAnswer = errors.New("client: no answer")
	// ErrNotFound: the ledger has no record of the key.
	ErrNotFound = errors.New("client: no such key")
)

// DefaultReplyGrace is how long a submission waits for the pushed reply before
// it also watches the ledger key.
const DefaultReplyGrace = 3 * time.Second

type options struct {
	prefix     string
	specs      map[string]toolSpec
	replyGrace time.Duration
}

// Option configures a Client.
type Option func(*options)

// WithPrefix sets the installation prefix. Default: intent.DefaultPrefix.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithKeySpec tells the client how tool derives its keys. Without it the client
// asks the workers' tool catalogue, and falls back to the default derivation
// (all args, no window) when no worker answers.
func WithKeySpec(tool string, spec intent.KeySpec) Option {
	return func(o *options) { o.specs[tool] = toolSpec{key: spec} }
}

// WithReplyGrace sets how long a submission waits for its pushed reply before
// it also watches the ledger. Default: DefaultReplyGrace.
func WithReplyGrace(d time.Duration) Option { return func(o *options) { o.replyGrace = d } }

// Client publishes intents and waits for their answers. It is safe for
// concurrent use.
type Client struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  intent.Names
	grace  time.Duration
	mu     sync.Mutex
	specs  map[string]toolSpec
	kv     jetstream.KeyValue
	ledger *dedup.Ledger
}

// New returns a client on nc.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	o := options{specs: map[string]toolSpec{}, replyGrace: DefaultReplyGrace}
	for _, opt := range opts {
		opt(&o)
	}
	names, err := intent.NewNames(o.prefix)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Client{nc: nc, js: js, names: names, grace: o.replyGrace, specs: o.specs}, nil
}

// Names returns the names the client uses.
func (c *Client) Names() intent.Names { return c.names }

// Submission is one published intent awaiting its answer.
type Submission struct {
	// Key and Fingerprint as the client derived them.
	Key, Fingerprint string
	// Duplicate reports that JetStream dropped the publish as a duplicate of an
	// earlier intent with this key: the answer comes from the ledger.
	Duplicate bool
	// Sequence is the intent's stream sequence (of the original when Duplicate).
	Sequence uint64

	c        *Client
	tool     string
	call     string
	noLedger bool // the tool keeps no ledger record: only the reply answers
	ch       chan *nats.Msg
	sub      *nats.Subscription
}

// Submit publishes env and waits for its answer until ctx is done. A duplicate
// is an answer (Result.Replayed), not an error; so is a conflict.
func (c *Client) Submit(ctx context.Context, env *intent.Envelope) (*intent.Result, error) {
	s, err := c.Publish(ctx, env)
	if err != nil {
		return nil, err
	}
	return s.Wait(ctx)
}

// Publish derives env's key, publishes it with Nats-Msg-Id set to the key and
// a private reply subject, and returns the submission to Wait on. For a tool
// keyed by time window, a missing created_at is set to now so that the client
// and the workers derive the same key.
func (c *Client) Publish(ctx context.Context, env *intent.Envelope) (*Submission, error) {
	if !intent.ValidTool(env.Tool) {
		return nil, fmt.Errorf("client: %w: tool %q must match [a-z0-9_-]{1,64}", intent.ErrInvalid, env.Tool)
	}
	ts := c.spec(ctx, env.Tool)
	spec := ts.key
	if spec.Window > 0 && env.CreatedAt.IsZero() {
		env.CreatedAt = time.Now().UTC()
	}
	id, err := intent.Derive(env, spec, time.Now())
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	data, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("client: encode intent: %w", err)
	}
	s := &Submission{Key: id.Key, Fingerprint: id.Fingerprint, c: c, tool: env.Tool, call: env.CallID, noLedger: ts.noLedger, ch: make(chan *nats.Msg, 4)}
	inbox := c.nc.NewRespInbox()
	s.sub, err = c.nc.ChanSubscribe(inbox, s.ch)
	if err != nil {
		return nil, fmt.Errorf("client: subscribe %s: %w", inbox, err)
	}
	msg := nats.NewMsg(c.names.IntentSubject(env.Tool))
	msg.Data = data
	msg.Header.Set(intent.HeaderReplyTo, inbox)
	injectTrace(ctx, msg.Header)
	var popts []jetstream.PublishOpt
	if !ts.noLedger {
		// Publish dedup answers a repeat from the ledger; a tool without the
		// ledger fires every intent, so its repeats must reach a worker.
		popts = append(popts, jetstream.WithMsgID(id.Key))
	}
	ack, err := c.publish(ctx, msg, popts...)
	if err != nil {
		_ = s.sub.Unsubscribe()
		return nil, fmt.Errorf("client: publish %s: %w", msg.Subject, err)
	}
	s.Duplicate, s.Sequence = ack.Duplicate, ack.Sequence
	return s, nil
}

// errCodeMsgIDInProcess is JetStream's answer to a publish whose Nats-Msg-Id
// another publish is storing right now (seen on replicated streams with
// concurrent copies): the copy is a duplicate, only not yet known as one.
const errCodeMsgIDInProcess = 10158

// publish publishes msg, and publishes it again after a short pause while
// JetStream answers that a publish with the same Nats-Msg-Id is in process:
// the retry is then acknowledged as a duplicate.
func (c *Client) publish(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	pause := 5 * time.Millisecond
	for {
		ack, err := c.js.PublishMsg(ctx, msg, opts...)
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeMsgIDInProcess {
			return ack, err
		}
		select {
		case <-time.After(pause):
			pause = min(2*pause, 500*time.Millisecond)
		case <-ctx.Done():
			return nil, err
		}
	}
}

// Wait returns the submission's answer: the pushed reply, or — when the
// publish was a duplicate or no reply came within the grace period — the
// record watched on the ledger key. A ledger record with another fingerprint
// is answered as a conflict (publish dedup hides a conflict from the
// workers). Wait returns at the first answer, awaiting_approval and uncertain
// included; WaitFinal goes on to the final one. It returns ErrNoAnswer when
// ctx ends first.
func (s *Submission) Wait(ctx context.Context) (*intent.Result, error) { return s.wait(ctx, false) }

// WaitFinal is Wait that goes on past awaiting_approval and uncertain
// answers, watching the ledger, until the operation's final answer
// (completed, failed, denied, conflict, rejected).
func (s *Submission) WaitFinal(ctx context.Context) (*intent.Result, error) { return s.wait(ctx, true) }

func (s *Submission) wait(ctx context.Context, final bool) (*intent.Result, error) {
	defer func() { _ = s.sub.Unsubscribe() }()
	grace := time.NewTimer(s.c.grace)
	defer grace.Stop()
	enough := func(st intent.Status) bool { return st.Final() || (!final && st.Answered()) }
	var updates <-chan jetstream.KeyValueEntry
	var watcher jetstream.KeyWatcher
	defer func() {
		if watcher != nil {
			_ = watcher.Stop()
		}
	}()
	// startWatch reads the record from the leader and, unless it already
	// answers, watches the key (a consumer on the ledger's stream, stopped
	// when Wait returns).
	startWatch := func() (*intent.Result, error) {
		if watcher != nil || s.noLedger {
			return nil, nil
		}
		if l, err := s.c.ledgerRO(ctx); err == nil {
			if rec, _, err := l.Get(ctx, s.Key); err == nil {
				if res := s.fromRecord(rec); enough(res.Status) {
					return res, nil
				}
			}
		}
		w, err := s.c.watch(ctx, s.Key)
		if err != nil {
			return nil, err
		}
		watcher, updates = w, w.Updates()
		return nil, nil
	}
	if s.Duplicate {
		if res, err := startWatch(); res != nil || err != nil {
			return res, err
		}
	}
	for {
		select {
		case m := <-s.ch:
			var res intent.Result
			if err := json.Unmarshal(m.Data, &res); err != nil {
				return nil, fmt.Errorf("client: undecodable answer: %w", err)
			}
			if enough(res.Status) {
				return &res, nil
			}
			// The final answer comes from the ledger.
			if res, err := startWatch(); res != nil || err != nil {
				return res, err
			}
		case <-grace.C:
			if res, err := startWatch(); res != nil || err != nil {
				return res, err
			}
		case e, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			rec, err := decodeRecord(e.Value())
			if err != nil {
				continue
			}
			if res := s.fromRecord(rec); enough(res.Status) {
				return res, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w for %s: %w", ErrNoAnswer, s.Key, ctx.Err())
		}
	}
}

// fromRecord is the answer a ledger record gives this submission.
func (s *Submission) fromRecord(rec dedup.Record) *intent.Result {
	if rec.Fingerprint != s.Fingerprint {
		return &intent.Result{
			Key: s.Key, Tool: s.tool, Status: intent.StatusConflict, Replayed: true,
			Fingerprint: s.Fingerprint, CallID: s.call, CompletedAt: time.Now().UTC(),
			Error: &intent.Error{Code: intent.CodeConflict, Message: fmt.Sprintf(
				"key %s was first used with other arguments (fingerprint %s, this intent's %s)",
				s.Key, rec.Fingerprint, s.Fingerprint)},
		}
	}
	at := rec.CompletedAt
	if at.IsZero() {
		at = rec.UpdatedAt
	}
	return &intent.Result{
		Key: s.Key, Tool: s.tool, Status: rec.Status,
		Replayed:    s.Duplicate || rec.IntentSeq != s.Sequence,
		Fingerprint: rec.Fingerprint, Attempts: rec.Attempts,
		Result: rec.Result, Error: rec.Error, CallID: s.call, CompletedAt: at,
	}
}

// Get reads key's ledger record (from the stream leader). It returns
// ErrNotFound when there is none.
func (c *Client) Get(ctx context.Context, key string) (dedup.Record, error) {
	l, err := c.ledgerRO(ctx)
	if err != nil {
		return dedup.Record{}, err
	}
	rec, _, err := l.Get(ctx, key)
	if errors.Is(err, dedup.ErrNotFound) {
		return rec, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return rec, err
}

// Watch waits until key's record has an answered status and returns it.
func (c *Client) Watch(ctx context.Context, key string) (dedup.Record, error) {
	w, err := c.watch(ctx, key)
	if err != nil {
		return dedup.Record{}, err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return dedup.Record{}, fmt.Errorf("%w for %s: watch closed", ErrNoAnswer, key)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if rec, err := decodeRecord(e.Value()); err == nil && rec.Status.Answered() {
				return rec, nil
			}
		case <-ctx.Done():
			return dedup.Record{}, fmt.Errorf("%w for %s: %w", ErrNoAnswer, key, ctx.Err())
		}
	}
}

func (c *Client) watch(ctx context.Context, key string) (jetstream.KeyWatcher, error) {
	kv, err := c.bucket(ctx)
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("client: watch %s: %w", key, err)
	}
	return w, nil
}

func (c *Client) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv != nil {
		return c.kv, nil
	}
	kv, err := c.js.KeyValue(ctx, c.names.Bucket)
	if err != nil {
		return nil, fmt.Errorf("client: ledger bucket %s: %w", c.names.Bucket, err)
	}
	c.kv = kv
	return kv, nil
}

func (c *Client) ledgerRO(ctx context.Context) (*dedup.Ledger, error) {
	kv, err := c.bucket(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ledger == nil {
		if c.ledger, err = dedup.New(c.js, kv); err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
	}
	return c.ledger, nil
}

func decodeRecord(data []byte) (dedup.Record, error) {
	var rec dedup.Record
	err := json.Unmarshal(data, &rec)
	return rec, err
}
