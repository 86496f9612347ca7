package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The tools of a chaos run, all webhooks to the sink.
const (
	toolName   = "chaos_op"     // most operations
	cappedTool = "chaos_capped" // --capped-share of them: max_in_flight 1, so it is under back-pressure
	probedTool = "chaos_probed" // --probed-share of them: a takeover probes the sink before it fires again
)

// Duplicate kinds: how the copies of one operation are sent.
const (
	kindSingle     = "single"     // one copy: no duplicate
	kindSequential = "sequential" // re-issued after each answer (keyed; publish dedup answers from the ledger)
	kindConcurrent = "concurrent" // copies published at once from separate goroutines (keyed)
	kindDelayed    = "delayed"    // a keyed copy sent after the publish-dedup window: it reaches a worker
	kindNoMsgID    = "no_msg_id"  // concurrent raw JetStream publishes without Nats-Msg-Id
	kindBatch      = "batch"      // parallel calls of one model response: an async burst, one call_id each
	copiesPerDup   = 3            // copies of every duplicated kind but delayed
	replyGrace     = 5 * time.Second
	publishAttempt = 5 * time.Second
)

var dupKinds = []string{kindSequential, kindConcurrent, kindDelayed, kindNoMsgID, kindBatch}

// copyOut is what one copy of an operation got.
type copyOut struct {
	Published bool
	Duplicate bool   // the publish was acknowledged as a duplicate
	Via       string // how the answer came: answer (client Wait), reply, ledger, settle; "" none
	Status    intent.Status
	Replayed  bool
	Result    json.RawMessage
	Code      string
	Err       string
	Acked     time.Time // when the publish was acknowledged
	// Seq is the stream sequence the publish was stored under (0 for a
	// duplicate) and Epoch the JetStream start that acknowledged it (its
	// count of restarts; -1 when a restart came between the publish and
	// its acknowledgement): a power loss takes the stored copies of its
	// epoch above the work stream's last sequence it kept.
	Seq   uint64
	Epoch int64
	// Republished counts the copy's publishes under the retry rule
	// (docs/protocol.md 7.2).
	Republished int
}

// stored notes a publish acknowledged as stored under seq, by the JetStream
// start (epoch) current before (pre) and after (post) it.
func (c *copyOut) stored(seq uint64, pre, post int64) {
	c.Seq, c.Epoch = seq, post
	if pre != post {
		c.Epoch = -1
	}
}

func (c *copyOut) setResult(res *intent.Result, via string) {
	c.Via, c.Status, c.Replayed, c.Result = via, res.Status, res.Replayed, res.Result
	if res.Error != nil {
		c.Code = res.Error.Code
	}
	c.Err = ""
}

// setRecord answers the copy from the ledger record of its key.
func (c *copyOut) setRecord(o *op, rec dedup.Record, via string) {
	if rec.Fingerprint != o.fp {
		c.setResult(&intent.Result{Status: intent.StatusConflict, Replayed: true, Error: &intent.Error{Code: intent.CodeConflict}}, via)
		return
	}
	c.setResult(&intent.Result{Status: rec.Status, Replayed: true, Result: rec.Result, Error: rec.Error}, via)
}

// op is one operation and its copies.
type op struct {
	id     string
	n      int
	kind   string
	tool   string // toolName, cappedTool or probedTool
	key    string
	fp     string
	args   json.RawMessage
	copies []copyOut
	// recordHolder is the holder of the key's ledger record after the run
	// ("" when unread): who recorded the outcome.
	recordHolder string
	// notFinal is the status of the key's ledger record after the run when
	// it is not final (absent, unreadable, pending, …); "" otherwise.
	notFinal string
}

func (o *op) envelope(session, callID string) *intent.Envelope {
	return &intent.Envelope{Tool: o.tool, Args: append(json.RawMessage(nil), o.args...), Session: session, CallID: callID}
}

// plan draws the operations of a run: enough that their copies add up to at
// least cfg.intents.
func plan(cfg config, session string, rng *rand.Rand) ([]*op, error) {
	var ops []*op
	for total := 0; total < cfg.intents; {
		n := len(ops)
		o := &op{id: fmt.Sprintf("op-%07d", n), n: n, kind: kindSingle, tool: toolName}
		if rng.Float64() >= cfg.singleShare {
			o.kind = dupKinds[rng.IntN(len(dupKinds))]
		}
		if cfg.cappedShare > 0 && rng.Float64() < cfg.cappedShare {
			o.tool = cappedTool
		} else if cfg.probedShare > 0 && rng.Float64() < cfg.probedShare/(1-cfg.cappedShare) {
			o.tool = probedTool
		}
		copies := 1
		switch o.kind {
		case kindDelayed:
			copies = 2
		case kindSingle:
		default:
			copies = copiesPerDup
		}
		o.copies = make([]copyOut, copies)
		o.args = json.RawMessage(fmt.Sprintf(`{"op":%q,"n":%d,"note":"chaos load"}`, o.id, n))
		id, err := intent.Derive(o.envelope(session, ""), intent.KeySpec{}, time.Now())
		if err != nil {
			return nil, err
		}
		o.key, o.fp = id.Key, id.Fingerprint
		ops = append(ops, o)
		total += copies
	}
	return ops, nil
}

// loader sends the copies of every operation and records their answers.
type loader struct {
	cfg     config
	session string
	nc      *nats.Conn
	js      jetstream.JetStream
	cl      *client.Client

	published atomic.Int64
	answered  atomic.Int64
	retries   atomic.Int64
	dups      atomic.Int64 // publishes acknowledged as duplicates
	recovered atomic.Int64 // unix nanos: when the last JetStream restart was ready
	nodesDown atomic.Bool  // a node fault is in progress
	epoch     atomic.Int64 // JetStream restarts begun: the start acknowledging publishes now
	republish atomic.Int64 // publishes again under the retry rule, by the load's own copies

	errMu     sync.Mutex
	pubErrors map[string]int // publish errors that were retried, by message
}

// noteErr counts a retried publish error by its message.
func (l *loader) noteErr(err error) {
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120]
	}
	l.errMu.Lock()
	defer l.errMu.Unlock()
	if l.pubErrors == nil {
		l.pubErrors = map[string]int{}
	}
	l.pubErrors[msg]++
}

// run sends every operation with cfg.agents in flight; delayed copies are
// sent by their own goroutines once their publish-dedup window has passed.
func (l *loader) run(ctx context.Context, ops []*op) {
	type due struct {
		o  *op
		at time.Time // the first copy's acknowledgement
	}
	delayed := make(chan due, len(ops))
	var dwg sync.WaitGroup
	for range max(1, l.cfg.agents/4) {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for d := range delayed {
				l.keyedCopy(ctx, d.o, 1, "", func(ctx context.Context) bool { return l.waitPastWindow(ctx, d.at) })
			}
		}()
	}

	work := make(chan *op)
	var wg sync.WaitGroup
	for range l.cfg.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				switch o.kind {
				case kindSingle:
					l.keyedCopy(ctx, o, 0, "", nil)
				case kindSequential:
					for i := range o.copies {
						l.keyedCopy(ctx, o, i, "", nil)
					}
				case kindConcurrent:
					l.parallel(len(o.copies), func(i int) { l.keyedCopy(ctx, o, i, "", nil) })
				case kindNoMsgID:
					l.parallel(len(o.copies), func(i int) { l.rawCopy(ctx, o, i, false) })
				case kindBatch:
					l.batch(ctx, o)
				case kindDelayed:
					l.keyedCopy(ctx, o, 0, "", nil)
					// The publish-dedup window runs from when the server
					// stored the first copy: before its acknowledgement.
					if o.copies[0].Published {
						delayed <- due{o, o.copies[0].Acked}
					}
				}
			}
		}()
	}
	for _, o := range ops {
		select {
		case work <- o:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	close(delayed)
	dwg.Wait()
}

func (l *loader) parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(i) }()
	}
	wg.Wait()
}

// waitPastWindow waits until the publish-dedup window of a message
// acknowledged at acked has surely passed, and reports false if ctx ended
// first. A restarted server rebuilds its dedup table from the stored
// messages and expires it one window after the restart, so a restart after
// acked moves the wait, and no wait ends while a node is down.
func (l *loader) waitPastWindow(ctx context.Context, acked time.Time) bool {
	for {
		for l.nodesDown.Load() {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return false
			case <-t.C:
			}
		}
		from := acked
		if r := time.Unix(0, l.recovered.Load()); r.After(from) {
			from = r
		}
		wait := time.Until(from.Add(l.cfg.dupWindow + time.Second))
		if wait <= 0 && !l.nodesDown.Load() {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// retry runs publish until it succeeds, for up to the answer budget. A
// gate, when given, is passed before every attempt (false: give up).
func (l *loader) retry(ctx context.Context, gate func(context.Context) bool, publish func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.answerBudget())
	defer cancel()
	for {
		if gate != nil && !gate(ctx) {
			return fmt.Errorf("waiting past the publish-dedup window: %w", context.Cause(ctx))
		}
		pctx, pcancel := context.WithTimeout(ctx, publishAttempt)
		err := publish(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		l.retries.Add(1)
		l.noteErr(err)
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// keyedCopy publishes copy i with the client (Nats-Msg-Id = key) and waits
// for its answer. A gate, when given, is passed before every publish attempt
// (false: give the copy up).
func (l *loader) keyedCopy(ctx context.Context, o *op, i int, callID string, gate func(context.Context) bool) {
	c := &o.copies[i]
	var sub *client.Submission
	var pre, post int64
	err := l.retry(ctx, gate, func(ctx context.Context) error {
		var err error
		pre = l.epoch.Load()
		sub, err = l.cl.Publish(ctx, o.envelope(l.session, callID))
		post = l.epoch.Load()
		return err
	})
	if err != nil {
		c.Err = "publish: " + err.Error()
		return
	}
	l.published.Add(1)
	c.Published, c.Duplicate, c.Acked = true, sub.Duplicate, time.Now()
	if sub.Duplicate {
		l.dups.Add(1)
	} else {
		c.stored(sub.Sequence, pre, post)
	}
	wctx, cancel := context.WithTimeout(ctx, l.cfg.answerBudget())
	defer cancel()
	res, err := sub.Wait(wctx)
	c.Republished = sub.Republished()
	l.republish.Add(int64(c.Republished))
	if err != nil {
		c.Err = err.Error()
		return
	}
	l.answered.Add(1)
	c.setResult(res, "answer")
}

// own is a copy published by the driver itself, with its reply inbox.
type own struct {
	msg *nats.Msg
	sub *nats.Subscription
	ch  chan *nats.Msg
}

func (l *loader) newOwn(o *op, callID string) (*own, error) {
	data, err := json.Marshal(o.envelope(l.session, callID))
	if err != nil {
		return nil, err
	}
	w := &own{msg: nats.NewMsg(l.cl.Names().IntentSubject(o.tool)), ch: make(chan *nats.Msg, 4)}
	w.msg.Data = data
	inbox := l.nc.NewRespInbox()
	if w.sub, err = l.nc.ChanSubscribe(inbox, w.ch); err != nil {
		return nil, err
	}
	w.msg.Header.Set(intent.HeaderReplyTo, inbox)
	return w, nil
}

// rawCopy publishes copy i without Nats-Msg-Id, so publish dedup cannot
// apply, and waits for its answer.
func (l *loader) rawCopy(ctx context.Context, o *op, i int, withID bool) {
	c := &o.copies[i]
	w, err := l.newOwn(o, fmt.Sprintf("call-%d", i))
	if err != nil {
		c.Err = err.Error()
		return
	}
	defer func() { _ = w.sub.Unsubscribe() }()
	var ack *jetstream.PubAck
	var pre, post int64
	err = l.retry(ctx, nil, func(ctx context.Context) error {
		var opts []jetstream.PublishOpt
		if withID {
			opts = append(opts, jetstream.WithMsgID(o.key))
		}
		var err error
		pre = l.epoch.Load()
		ack, err = l.js.PublishMsg(ctx, w.msg, opts...)
		post = l.epoch.Load()
		return err
	})
	if err != nil {
		c.Err = "publish: " + err.Error()
		return
	}
	l.sent(ctx, o, c, w, ack, pre, post)
}

// batch sends the copies of o as one model response would carry parallel
// calls: an async burst with Nats-Msg-Id = key, one call_id each.
func (l *loader) batch(ctx context.Context, o *op) {
	ws := make([]*own, len(o.copies))
	futs := make([]jetstream.PubAckFuture, len(o.copies))
	pre := l.epoch.Load()
	for i := range ws {
		w, err := l.newOwn(o, fmt.Sprintf("call-%d", i))
		if err != nil {
			o.copies[i].Err = err.Error()
			continue
		}
		ws[i] = w
		futs[i], _ = l.js.PublishMsgAsync(w.msg, jetstream.WithMsgID(o.key))
	}
	l.parallel(len(ws), func(i int) {
		w, c := ws[i], &o.copies[i]
		if w == nil {
			return
		}
		defer func() { _ = w.sub.Unsubscribe() }()
		var ack *jetstream.PubAck
		pre := pre
		if f := futs[i]; f != nil {
			t := time.NewTimer(publishAttempt)
			select {
			case ack = <-f.Ok():
			case <-f.Err():
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		post := l.epoch.Load()
		if ack == nil { // the async publish failed: publish again, the same message id
			err := l.retry(ctx, nil, func(ctx context.Context) error {
				var err error
				pre = l.epoch.Load()
				ack, err = l.js.PublishMsg(ctx, w.msg, jetstream.WithMsgID(o.key))
				post = l.epoch.Load()
				return err
			})
			if err != nil {
				c.Err = "publish: " + err.Error()
				return
			}
		}
		l.sent(ctx, o, c, w, ack, pre, post)
	})
}

// sent counts copy c of o as published (and as a publish duplicate when the
// ack says so) and waits for its answer.
func (l *loader) sent(ctx context.Context, o *op, c *copyOut, w *own, ack *jetstream.PubAck, pre, post int64) {
	l.published.Add(1)
	c.Published, c.Duplicate, c.Acked = true, ack.Duplicate, time.Now()
	if ack.Duplicate {
		l.dups.Add(1)
	} else {
		c.stored(ack.Sequence, pre, post)
	}
	l.await(ctx, o, c, w)
}

// await waits for the copy's answer: the pushed reply, or the key's ledger
// record, which it watches once the reply grace has passed (at once for a
// duplicate, which no worker sees). It follows the retry rule
// (docs/protocol.md 7.2) as pkg/client does: after the grace, then twice
// it, and so on, while no reply came and the key shows no record that will
// answer, it publishes the intent again under a fresh message id — its
// publish may have been stored and then lost by a server crash.
func (l *loader) await(ctx context.Context, o *op, c *copyOut, w *own) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.answerBudget())
	defer cancel()
	type answer struct {
		rec dedup.Record
		err error
	}
	var fromLedger chan answer
	watch := func() {
		if fromLedger != nil {
			return
		}
		ch := make(chan answer, 1)
		fromLedger = ch
		go func() {
			rec, err := l.cl.Watch(ctx, o.key)
			ch <- answer{rec, err}
		}()
	}
	if c.Duplicate {
		watch()
	}
	grace := replyGrace
	t := time.NewTimer(grace)
	defer t.Stop()
	for {
		select {
		case m := <-w.ch:
			var res intent.Result
			if err := json.Unmarshal(m.Data, &res); err != nil {
				c.Err = "undecodable answer: " + err.Error()
				return
			}
			l.answered.Add(1)
			c.setResult(&res, "reply")
			return
		case <-t.C:
			watch()
			if l.republishIfUnrecorded(ctx, o, w.msg) {
				c.Republished++
			}
			grace *= 2
			t.Reset(grace)
		case a := <-fromLedger:
			if a.err != nil {
				c.Err = a.err.Error()
				return
			}
			l.answered.Add(1)
			c.setRecord(o, a.rec, "ledger")
			return
		case <-ctx.Done():
			c.Err = ctx.Err().Error()
			return
		}
	}
}

// republishIfUnrecorded publishes msg, an intent of o, again under a fresh
// message id when o's key has no record, or only a pending one whose lease
// ran out a lease ago (7.2); it reports whether it did.
func (l *loader) republishIfUnrecorded(ctx context.Context, o *op, msg *nats.Msg) bool {
	rec, err := l.cl.Get(ctx, o.key)
	switch {
	case errors.Is(err, client.ErrNotFound):
	case err != nil:
		return false // tried again at the next grace
	case rec.Status == intent.StatusPending && rec.LeaseExpired(time.Now().Add(-l.cfg.lease)):
	default:
		return false
	}
	m := nats.NewMsg(msg.Subject)
	m.Data = msg.Data
	m.Header.Set(intent.HeaderReplyTo, msg.Header.Get(intent.HeaderReplyTo))
	pctx, cancel := context.WithTimeout(ctx, publishAttempt)
	defer cancel()
	if _, err := l.js.PublishMsg(pctx, m, jetstream.WithMsgID(o.key+":"+nuid.Next())); err != nil {
		return false
	}
	l.republish.Add(1)
	return true
}

// settle answers every published copy still without an answer from the
// ledger record of its key: first by reading every such key (32 at a time),
// then, for the keys whose record is not answered yet, by watching them all
// at once until they are or ctx ends, so that no key that never gets a
// record keeps another from being watched.
func (l *loader) settle(ctx context.Context, ops []*op) (settled, open int) {
	var todo []*op
	for _, o := range ops {
		if o.unanswered() > 0 {
			todo = append(todo, o)
		}
	}
	var mu sync.Mutex
	answer := func(o *op, rec dedup.Record, err error) {
		mu.Lock()
		defer mu.Unlock()
		for i := range o.copies {
			c := &o.copies[i]
			if !c.Published || c.Status != "" {
				continue
			}
			if err != nil {
				c.Err = "settle: " + err.Error()
				open++
				continue
			}
			c.setRecord(o, rec, "settle")
			settled++
		}
	}
	var waiting []*op
	work := make(chan *op)
	var wg sync.WaitGroup
	for range min(32, max(1, len(todo))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				if rec, err := l.cl.Get(ctx, o.key); err == nil && rec.Status.Answered() {
					answer(o, rec, nil)
					continue
				}
				mu.Lock()
				waiting = append(waiting, o)
				mu.Unlock()
			}
		}()
	}
	for _, o := range todo {
		work <- o
	}
	close(work)
	wg.Wait()
	for _, o := range waiting {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := l.awaitRecord(ctx, o, func() {
				mu.Lock()
				defer mu.Unlock()
				for i := range o.copies {
					if c := &o.copies[i]; c.Published && c.Status == "" {
						c.Republished++
					}
				}
			})
			answer(o, rec, err)
		}()
	}
	wg.Wait()
	return settled, open
}

// awaitRecord watches o's key until its record answers, and meanwhile, as
// the callers still waiting do under the retry rule (7.2), publishes o again
// after the reply grace, twice it, and so on, while the key shows no record
// that will answer; republished is called after each such publish.
func (l *loader) awaitRecord(ctx context.Context, o *op, republished func()) (dedup.Record, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	type answer struct {
		rec dedup.Record
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		rec, err := l.cl.Watch(wctx, o.key)
		ch <- answer{rec, err}
	}()
	data, err := json.Marshal(o.envelope(l.session, ""))
	if err != nil {
		return dedup.Record{}, err
	}
	msg := nats.NewMsg(l.cl.Names().IntentSubject(o.tool))
	msg.Data = data
	msg.Header.Set(intent.HeaderReplyTo, l.nc.NewRespInbox()) // the record answers
	grace := replyGrace
	t := time.NewTimer(grace)
	defer t.Stop()
	for {
		select {
		case a := <-ch:
			return a.rec, a.err
		case <-t.C:
			if l.republishIfUnrecorded(ctx, o, msg) {
				republished()
			}
			grace *= 2
			t.Reset(grace)
		}
	}
}

// unanswered counts o's published copies without an answer.
func (o *op) unanswered() int {
	n := 0
	for _, c := range o.copies {
		if c.Published && c.Status == "" {
			n++
		}
	}
	return n
}

// ledgerCheck reads the ledger record of every operation that was published,
// notes who recorded it, and returns how many are not final, by status.
func (l *loader) ledgerCheck(ctx context.Context, ops []*op) map[string]int {
	out := map[string]int{}
	var mu sync.Mutex
	work := make(chan *op)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				rec, err := l.cl.Get(ctx, o.key)
				status := string(rec.Status)
				switch {
				case errors.Is(err, client.ErrNotFound):
					status = "absent"
				case err != nil:
					status = "unreadable"
				}
				o.recordHolder = rec.Holder
				if err == nil && rec.Status.Final() {
					continue
				}
				o.notFinal = status
				mu.Lock()
				out[status]++
				mu.Unlock()
			}
		}()
	}
	for _, o := range ops {
		if o.published() {
			work <- o
		}
	}
	close(work)
	wg.Wait()
	return out
}

func (o *op) published() bool {
	for _, c := range o.copies {
		if c.Published {
			return true
		}
	}
	return false
}

// newRand returns the run's deterministic random source for seed.
func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
