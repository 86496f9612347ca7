package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The stages' unit tests: a worker built without JetStream (memLedger,
// messages delivered by hand, answers and dead letters caught), driven
// through dispatch as Run drives it.

// stageBundle is a worker on a memLedger, and what it published.
type stageBundle struct {
	w       *Worker
	ledger  *memLedger
	replies *memReplies
	letters *memLetters
	names   intent.Names
	stop    context.Context // cancelled when the test ends, as Run's ctx
	halt    func()          // cancels stop: the worker is asked to stop
	seq     atomic.Uint64
	mu      sync.Mutex
	sent    []*memMsg
}

func newStages(t *testing.T, cfg Config, tools ...*effects.Tool) *stageBundle {
	t.Helper()
	reg, err := effects.NewRegistry(tools...)
	require.NoError(t, err)
	if cfg.Holder == "" {
		cfg.Holder = "unit"
	}
	require.NoError(t, prepare(&cfg, reg))
	names, err := intent.NewNames(cfg.Prefix)
	require.NoError(t, err)
	b := &stageBundle{ledger: newMemLedger(), replies: &memReplies{got: map[string]chan memAnswer{}}, letters: &memLetters{}, names: names}
	b.w = newWorker(cfg, reg, zaptest.NewLogger(t), &resources{names: names}, b.ledger, b.replies, b.letters)
	b.w.pool = newHandlerPool(cfg.Concurrency, time.Minute)
	beats, stopBeats := context.WithCancel(context.Background())
	beatsDone := make(chan struct{})
	go func() { defer close(beatsDone); b.w.beats.run(beats) }()
	stop, cancel := context.WithCancel(context.Background())
	b.stop, b.halt = stop, cancel
	t.Cleanup(func() {
		cancel()
		b.w.handling.Wait()
		b.w.pool.close()
		stopBeats()
		<-beatsDone
		for _, m := range b.sent {
			require.EqualValues(t, 1, m.settles.Load(), "message %d settled once", m.meta.Sequence.Stream)
		}
	})
	return b
}

// intent is a first delivery of an intent of tool with args, a reply
// subject of its own and a new stream sequence.
func (b *stageBundle) intent(tool, args string) *memMsg {
	return b.message(b.names.IntentSubject(tool), fmt.Sprintf(`{"tool":%q,"args":%s}`, tool, args))
}

// message is a first delivery of data on subject (see intent).
func (b *stageBundle) message(subject, data string) *memMsg {
	seq := b.seq.Add(1)
	m := &memMsg{subject: subject, data: []byte(data), header: nats.Header{}, settled: make(chan settlement, 2)}
	m.header.Set(intent.HeaderReplyTo, "_INBOX.unit."+strconv.FormatUint(seq, 10))
	m.meta = jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumDelivered: 1, Timestamp: time.Now()}
	return m
}

// send hands m to the worker as the consumer would.
func (b *stageBundle) send(m *memMsg) *memMsg {
	b.mu.Lock()
	b.sent = append(b.sent, m)
	b.mu.Unlock()
	b.w.dispatch(b.stop, context.Background(), m)
	return m
}

// again is m's next delivery.
func (m *memMsg) again() *memMsg {
	next := &memMsg{subject: m.subject, data: m.data, header: m.header, meta: m.meta, settled: make(chan settlement, 2)}
	next.meta.NumDelivered++
	return next
}

// answer is the answer m's caller got.
func (b *stageBundle) answer(t *testing.T, m *memMsg) intent.Result {
	t.Helper()
	a := waitFor(t, b.replies.to(m.header.Get(intent.HeaderReplyTo)))
	require.Equal(t, m.meta.Sequence.Stream, a.seq, "the answer is bound to the message it answers")
	return a.res
}

// unanswered checks that m's caller got no answer; call it once m is
// settled (the answer goes first).
func (b *stageBundle) unanswered(t *testing.T, m *memMsg) {
	t.Helper()
	require.Empty(t, b.replies.to(m.header.Get(intent.HeaderReplyTo)))
}

// record is key's record in the ledger.
func (b *stageBundle) record(t *testing.T, key string) dedup.Record {
	t.Helper()
	rec, _, err := b.ledger.Get(t.Context(), key)
	require.NoError(t, err)
	return rec
}

// identity is the key and fingerprint the worker derives for tool's args.
func (b *stageBundle) identity(t *testing.T, tool, args string) intent.Identity {
	t.Helper()
	env, err := intent.Decode(fmt.Appendf(nil, `{"tool":%q,"args":%s}`, tool, args), intent.Limits{})
	require.NoError(t, err)
	tl, _ := b.w.tools.Lookup(tool)
	id, err := intent.Derive(env, tl.KeySpec, time.Now())
	require.NoError(t, err)
	return id
}

// waitFor receives from ch, bounded by the test's own context.
func waitFor[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatal("nothing came")
		panic("unreachable")
	}
}

// memMsg is an intent's message delivered by hand; settled gets how it was
// settled.
type memMsg struct {
	subject  string
	header   nats.Header
	data     []byte
	meta     jetstream.MsgMetadata
	settled  chan settlement
	settles  atomic.Int32
	progress atomic.Int32
	mu       sync.Mutex
	kept     []time.Time // when the consumer heard of it: each InProgress, and its settlement
}

// keptAt notes that the consumer heard of m now.
func (m *memMsg) keptAt() {
	m.mu.Lock()
	m.kept = append(m.kept, time.Now())
	m.mu.Unlock()
}

// longestSilence is the longest time from since to m's settlement in which
// the consumer heard nothing of m: past the consumer's AckWait, the server
// would have delivered it again.
func (m *memMsg) longestSilence(since time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	longest, last := time.Duration(0), since
	for _, at := range m.kept {
		longest, last = max(longest, at.Sub(last)), at
	}
	return longest
}

type settlement struct {
	verb   verb
	delay  time.Duration
	reason string
}

var _ message = (*memMsg)(nil)

func (m *memMsg) Subject() string                           { return m.subject }
func (m *memMsg) Headers() nats.Header                      { return m.header }
func (m *memMsg) Data() []byte                              { return m.data }
func (m *memMsg) Metadata() (*jetstream.MsgMetadata, error) { return &m.meta, nil }
func (m *memMsg) InProgress() error                         { m.progress.Add(1); m.keptAt(); return nil }
func (m *memMsg) Ack() error                                { return m.settle(settlement{verb: verbAck}) }
func (m *memMsg) NakWithDelay(d time.Duration) error {
	return m.settle(settlement{verb: verbNak, delay: d})
}
func (m *memMsg) TermWithReason(reason string) error {
	return m.settle(settlement{verb: verbTerm, reason: reason})
}

func (m *memMsg) settle(s settlement) error {
	m.keptAt()
	m.settles.Add(1)
	m.settled <- s
	return nil
}

// settlement is how m was settled.
func (m *memMsg) settlement(t *testing.T) settlement {
	t.Helper()
	return waitFor(t, m.settled)
}

// memReplies catches the answers published, by reply subject.
type memReplies struct {
	mu  sync.Mutex
	got map[string]chan memAnswer
}

type memAnswer struct {
	res intent.Result
	seq uint64
}

func (r *memReplies) to(subject string) chan memAnswer {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.got[subject]
	if !ok {
		ch = make(chan memAnswer, 4)
		r.got[subject] = ch
	}
	return ch
}

func (r *memReplies) PublishMsg(m *nats.Msg) error {
	var a memAnswer
	if err := json.Unmarshal(m.Data, &a.res); err != nil {
		return err
	}
	a.seq, _ = strconv.ParseUint(m.Header.Get(intent.HeaderIntentSeq), 10, 64)
	r.to(m.Subject) <- a
	return nil
}

// memLetters catches the dead letters; fail, when set, refuses them.
type memLetters struct {
	mu      sync.Mutex
	letters []*nats.Msg
	fail    error
}

func (l *memLetters) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail != nil {
		return nil, l.fail
	}
	l.letters = append(l.letters, m)
	return &jetstream.PubAck{}, nil
}

func (l *memLetters) all() []*nats.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*nats.Msg(nil), l.letters...)
}

// counted is an effect that counts its calls and returns what fn does.
func counted(calls *atomic.Int32, fn func(n int32) (effects.Outcome, error)) effects.Effect {
	return effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) { return fn(calls.Add(1)) })
}

func sent(int32) (effects.Outcome, error) {
	return effects.Outcome{Result: json.RawMessage(`"sent"`), Invocations: 1}, nil
}

// An intent fires once: its answer is the effect's, recorded; a duplicate
// is answered from the record (the answer cache's, or the ledger's) and a
// redelivery of the same call is its own outcome again.
func TestStagesFireOnceThenReplay(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		cache time.Duration
		hits  float64
	}{{"answer cache", 0, 2}, {"ledger", NoAnswerCache, 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			b := newStages(t, Config{AnswerCache: c.cache}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
			first := b.send(b.intent("send", `{"to":"a"}`))
			require.Equal(t, verbAck, first.settlement(t).verb)
			res := b.answer(t, first)
			require.Equal(t, intent.StatusCompleted, res.Status)
			require.False(t, res.Replayed)
			require.JSONEq(t, `"sent"`, string(res.Result))
			rec := b.record(t, res.Key)
			require.Equal(t, intent.StatusCompleted, rec.Status)
			require.Equal(t, first.meta.Sequence.Stream, rec.IntentSeq)

			dup := b.send(b.intent("send", `{"to":"a"}`))
			require.Equal(t, verbAck, dup.settlement(t).verb)
			replayed := b.answer(t, dup)
			require.True(t, replayed.Replayed)
			require.Equal(t, res.Key, replayed.Key)
			require.JSONEq(t, `"sent"`, string(replayed.Result))

			redelivered := b.send(first.again())
			require.Equal(t, verbAck, redelivered.settlement(t).verb)
			require.False(t, b.answer(t, redelivered).Replayed, "the same call's own outcome")
			require.EqualValues(t, 1, calls.Load())
			require.Equal(t, c.hits, testutil.ToFloat64(b.w.m.cacheHits.WithLabelValues("send")))
			require.Equal(t, 2.0, testutil.ToFloat64(b.w.m.replays.WithLabelValues("send")))
			require.Equal(t, 3.0, testutil.ToFloat64(b.w.m.received.WithLabelValues("send")))
			require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.fired.WithLabelValues("send")))
			require.Equal(t, 1, testutil.CollectAndCount(b.w.m.effectTime), "the effect's time")
			require.Equal(t, 1, testutil.CollectAndCount(b.w.m.claimToDone), "the firing's time to its record")
			require.Equal(t, 1, testutil.CollectAndCount(b.w.m.endToEnd), "the answers' times")
		})
	}
}

// Bad input is answered rejected, dead-lettered with its reason and never
// delivered again; nothing reaches the ledger.
func TestStagesRejectBadInput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, subject, data, key, code string
	}{
		{"not json", "send", `{"tool":`, "", intent.CodeInvalidIntent},
		{"unknown tool", "nope", `{"tool":"nope","args":{}}`, "", intent.CodeUnknownTool},
		{"other tool than the subject's", "send", `{"tool":"keyed","args":{"to":"a"}}`, "", intent.CodeToolMismatch},
		{"key arg missing", "keyed", `{"tool":"keyed","args":{"cc":"a"}}`, "", intent.CodeInvalidIntent},
		{"client derived another key", "send", `{"tool":"send","args":{}}`, "send.not-the-workers", intent.CodeKeyMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			b := newStages(t, Config{},
				&effects.Tool{Name: "send", Effect: counted(&calls, sent)},
				&effects.Tool{Name: "keyed", KeySpec: intent.KeySpec{KeyArgs: []string{"to"}}, Effect: counted(&calls, sent)})
			m := b.message(b.names.IntentSubject(c.subject), c.data)
			if c.key != "" {
				m.header.Set(intent.HeaderKey, c.key)
			}
			s := b.send(m).settlement(t)
			require.Equal(t, verbTerm, s.verb)
			require.True(t, strings.HasPrefix(s.reason, c.code+": "), s.reason)
			res := b.answer(t, m)
			require.Equal(t, intent.StatusRejected, res.Status)
			require.Equal(t, c.code, res.Error.Code)
			letters := b.letters.all()
			require.Len(t, letters, 1)
			require.Equal(t, s.reason, letters[0].Header.Get(intent.HeaderDLQReason))
			require.Equal(t, c.data, string(letters[0].Data))
			require.Zero(t, b.ledger.len())
			require.Zero(t, calls.Load())
			require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.badInputs.WithLabelValues(b.w.m.tool(res.Tool), c.code)))
			require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.deadLetters.WithLabelValues(b.w.m.tool(c.subject))))
		})
	}
}

// A key used again with other arguments is a conflict: answered, never
// fired.
func TestStagesConflict(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	first := b.send(b.message(b.names.IntentSubject("send"), `{"tool":"send","key":"order-1","args":{"to":"a"}}`))
	require.Equal(t, verbAck, first.settlement(t).verb)
	other := b.send(b.message(b.names.IntentSubject("send"), `{"tool":"send","key":"order-1","args":{"to":"b"}}`))
	require.Equal(t, verbAck, other.settlement(t).verb)
	res := b.answer(t, other)
	require.Equal(t, intent.StatusConflict, res.Status)
	require.Equal(t, b.answer(t, first).Fingerprint, res.RecordFingerprint)
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.conflicts.WithLabelValues("send")))
}

// A session over its rate is answered rate_limited; nothing is claimed.
func TestStagesSessionRate(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{SessionRate: 0.001, SessionBurst: 1}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	ok := b.send(b.message(b.names.IntentSubject("send"), `{"tool":"send","session":"s","args":{"n":1}}`))
	require.Equal(t, verbAck, ok.settlement(t).verb)
	limited := b.send(b.message(b.names.IntentSubject("send"), `{"tool":"send","session":"s","args":{"n":2}}`))
	require.Equal(t, verbAck, limited.settlement(t).verb)
	res := b.answer(t, limited)
	require.Equal(t, intent.CodeRateLimited, res.Error.Code)
	_, _, err := b.ledger.Get(t.Context(), res.Key)
	require.ErrorIs(t, err, dedup.ErrNotFound)
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.limited.WithLabelValues("send", "session_rate")))
}

// A transient failure gives the key back and delivers the intent again,
// later each time, unanswered; at the last delivery it is the outcome.
func TestStagesTransientFailure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{MaxDeliver: 3, RetryDelay: time.Second, MaxRetryDelay: time.Minute},
		&effects.Tool{Name: "send", Effect: counted(&calls, func(int32) (effects.Outcome, error) {
			return effects.Outcome{Invocations: 1}, errors.New("connection refused")
		})})
	m := b.send(b.intent("send", `{}`))
	key := b.identity(t, "send", `{}`).Key
	for delivery := 1; delivery < 3; delivery++ {
		s := m.settlement(t)
		require.Equal(t, settlement{verb: verbNak, delay: time.Duration(delivery) * time.Second}, s, "delivered again, later each time")
		b.unanswered(t, m)
		rec := b.record(t, key)
		require.True(t, rec.Released())
		require.Equal(t, delivery, rec.Attempts)
		m = b.send(m.again())
	}
	require.Equal(t, verbAck, m.settlement(t).verb)
	res := b.answer(t, m)
	require.Equal(t, intent.StatusFailed, res.Status)
	require.True(t, strings.HasPrefix(res.Error.Message, "gave up after 3 deliveries: connection refused"), res.Error.Message)
	require.Equal(t, 3, res.Attempts)
	require.Equal(t, intent.StatusFailed, b.record(t, key).Status)
	require.Equal(t, 3.0, testutil.ToFloat64(b.w.m.failures.WithLabelValues("send", "transient")))
	require.Zero(t, testutil.ToFloat64(b.w.m.fired.WithLabelValues("send")))
}

// A permanent failure is the operation's outcome: recorded and answered.
func TestStagesPermanentFailure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, func(int32) (effects.Outcome, error) {
		return effects.Outcome{Invocations: 1}, effects.Permanent(intent.CodeEffectFailed, "422 invalid recipient")
	})})
	m := b.send(b.intent("send", `{}`))
	require.Equal(t, verbAck, m.settlement(t).verb)
	res := b.answer(t, m)
	require.Equal(t, intent.StatusFailed, res.Status)
	require.Contains(t, res.Error.Message, "422 invalid recipient")
	require.Equal(t, intent.StatusFailed, b.record(t, res.Key).Status)
	require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.failures.WithLabelValues("send", "permanent")))
	require.Zero(t, testutil.ToFloat64(b.w.m.failures.WithLabelValues("send", "transient")))
}

// While the ledger cannot be reached the intent is held, not delivered
// again: the claim and the outcome's record are tried until they land.
func TestStagesHoldThroughALedgerOutage(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	var faults atomic.Int32
	b.ledger.fault = func(op string) error {
		if (op == "claim" || op == "complete") && faults.Add(1) <= 4 {
			return fmt.Errorf("%s: %w", op, nats.ErrTimeout)
		}
		return nil
	}
	m := b.send(b.intent("send", `{}`))
	require.Equal(t, verbAck, m.settlement(t).verb, "never a nak")
	require.Equal(t, intent.StatusCompleted, b.answer(t, m).Status)
	require.EqualValues(t, 1, calls.Load())
	require.GreaterOrEqual(t, faults.Load(), int32(5), "the claim, then the record, were refused")
}

// A duplicate of an operation in flight waits for its holder and is
// answered with its outcome.
func TestStagesWaitForTheHolder(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	id := b.identity(t, "send", `{"to":"a"}`)
	holder, err := b.ledger.Claim(t.Context(), dedup.ClaimRequest{Key: id.Key, Tool: "send", Fingerprint: id.Fingerprint, Holder: "other", Lease: time.Minute, IntentSeq: 1000})
	require.NoError(t, err)
	b.ledger.waits = make(chan string, 1)
	m := b.send(b.intent("send", `{"to":"a"}`))
	require.Equal(t, id.Key, waitFor(t, b.ledger.waits), "the duplicate waits")
	_, err = holder.Lease.Complete(t.Context(), json.RawMessage(`"theirs"`), 1)
	require.NoError(t, err)
	require.Equal(t, verbAck, m.settlement(t).verb)
	res := b.answer(t, m)
	require.True(t, res.Replayed)
	require.JSONEq(t, `"theirs"`, string(res.Result))
	require.Zero(t, calls.Load())
	require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.coalesced.WithLabelValues("send")))
}

// A duplicate waiting for a holder whose record is removed meanwhile (an
// operator forgot it) claims the key again, and fires.
func TestStagesWaitEndsWithTheRecordRemoved(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	id := b.identity(t, "send", `{"to":"a"}`)
	_, err := b.ledger.Claim(t.Context(), dedup.ClaimRequest{Key: id.Key, Tool: "send", Fingerprint: id.Fingerprint, Holder: "other", Lease: time.Minute})
	require.NoError(t, err)
	b.ledger.waits = make(chan string, 1)
	m := b.send(b.intent("send", `{"to":"a"}`))
	waitFor(t, b.ledger.waits)
	b.ledger.remove(id.Key)
	require.Equal(t, verbAck, m.settlement(t).verb)
	res := b.answer(t, m)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.False(t, res.Replayed)
	require.EqualValues(t, 1, calls.Load())
}

// A holder whose lease expired is confirmed gone — its record unchanged for
// a lease — before its lease is taken over: then the operation fires again,
// or is held as uncertain when the tool says so.
func TestStagesTakeOverAnAbandonedOperation(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		abandoned intent.Abandon
		status    intent.Status
		calls     int32
	}{{intent.AbandonRetry, intent.StatusCompleted, 1}, {intent.AbandonHold, intent.StatusUncertain, 0}} {
		t.Run(string(c.abandoned), func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			b := newStages(t, Config{}, &effects.Tool{Name: "send", Lease: time.Second, Effect: counted(&calls, sent),
				Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, OnAbandoned: c.abandoned}})
			id := b.identity(t, "send", `{}`)
			past := time.Now().Add(-time.Minute).UTC()
			b.ledger.set(id.Key, dedup.Record{Status: intent.StatusPending, Tool: "send", Fingerprint: id.Fingerprint, Holder: "vanished",
				LeaseUntil: past, Attempt: 1, CreatedAt: past, UpdatedAt: past})
			m := b.send(b.intent("send", `{}`))
			require.Equal(t, verbAck, m.settlement(t).verb)
			res := b.answer(t, m)
			require.Equal(t, c.status, res.Status)
			rec := b.record(t, id.Key)
			require.Equal(t, c.status, rec.Status)
			require.Equal(t, 2, rec.Attempt)
			require.Equal(t, c.calls, calls.Load())
			require.Equal(t, float64(c.calls), testutil.ToFloat64(b.w.m.takeovers.WithLabelValues("send")), "a takeover that fires")
		})
	}
}

// An operation that needs an approval is parked, answered
// awaiting_approval; an operator's approval fires it, once, and the
// decision's caller is answered with its outcome.
func TestStagesApprovalParksThenFires(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "refund", Effect: counted(&calls, sent),
		Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, Approval: true, ApprovalTTL: time.Hour, OnAbandoned: intent.AbandonRetry}})
	parked := b.send(b.intent("refund", `{"order":1}`))
	require.Equal(t, verbAck, parked.settlement(t).verb)
	res := b.answer(t, parked)
	require.Equal(t, intent.StatusAwaitingApproval, res.Status)
	require.Zero(t, calls.Load())

	approve := b.send(b.message(b.names.ControlSubject(intent.ControlApprove), fmt.Sprintf(`{"key":%q,"by":"ops"}`, res.Key)))
	require.Equal(t, verbAck, approve.settlement(t).verb)
	fired := b.answer(t, approve)
	require.Equal(t, intent.StatusCompleted, fired.Status)
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, parked.meta.Sequence.Stream, b.record(t, res.Key).IntentSeq, "the firing answers the call that parked it")

	again := b.send(b.message(b.names.ControlSubject(intent.ControlApprove), fmt.Sprintf(`{"key":%q,"by":"ops"}`, res.Key)))
	require.Equal(t, verbAck, again.settlement(t).verb)
	require.Equal(t, intent.StatusCompleted, b.answer(t, again).Status)
	require.EqualValues(t, 1, calls.Load(), "approved twice, fired once")
	require.Equal(t, 2.0, testutil.ToFloat64(b.w.m.decisions.WithLabelValues(intent.ControlApprove)))
	require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.fired.WithLabelValues("refund")))
}

// A user's decision (the subjects the MCP server may publish on) applies
// only to a tool whose approver is the user: on an operator's tool it is
// refused, nothing is recorded and nothing fires; an operator's approval
// of it still fires it.
func TestStagesUserDecisionOnOperatorTool(t *testing.T) {
	t.Parallel()
	var calls, userCalls atomic.Int32
	b := newStages(t, Config{},
		&effects.Tool{Name: "refund", Effect: counted(&calls, sent),
			Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, Approval: true, ApprovalTTL: time.Hour, OnAbandoned: intent.AbandonRetry}},
		&effects.Tool{Name: "tip", Effect: counted(&userCalls, sent),
			Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, Approval: true, UserApproves: true, ApprovalTTL: time.Hour, OnAbandoned: intent.AbandonRetry}})
	parked := b.send(b.intent("refund", `{"order":1}`))
	res := b.answer(t, parked)
	require.Equal(t, intent.StatusAwaitingApproval, res.Status)

	for _, op := range []string{intent.ControlUserApprove, intent.ControlUserDeny} {
		m := b.send(b.message(b.names.ControlSubject(op), fmt.Sprintf(`{"key":%q,"by":"the user at agent"}`, res.Key)))
		require.Equal(t, verbAck, m.settlement(t).verb)
		refused := b.answer(t, m)
		require.Equal(t, intent.StatusRejected, refused.Status, "%s of an operator's tool", op)
		require.Equal(t, intent.CodeInvalidIntent, refused.Error.Code, "%s of an operator's tool", op)
		require.Contains(t, refused.Error.Message, "approved by an operator")
		rec := b.record(t, res.Key)
		require.Equal(t, intent.StatusAwaitingApproval, rec.Status, "%s of an operator's tool recorded nothing", op)
		require.Nil(t, rec.Decision, "%s of an operator's tool recorded nothing", op)
		require.Zero(t, calls.Load(), "%s of an operator's tool fired nothing", op)
	}

	approve := b.send(b.message(b.names.ControlSubject(intent.ControlApprove), fmt.Sprintf(`{"key":%q,"by":"ops"}`, res.Key)))
	require.Equal(t, intent.StatusCompleted, b.answer(t, approve).Status)
	require.EqualValues(t, 1, calls.Load(), "the operator's approval fired it")

	// The user's approval of a tool the user approves fires it, recorded
	// as an approval by the user.
	tip := b.answer(t, b.send(b.intent("tip", `{"n":1}`)))
	require.Equal(t, intent.StatusAwaitingApproval, tip.Status)
	user := b.send(b.message(b.names.ControlSubject(intent.ControlUserApprove), fmt.Sprintf(`{"key":%q,"by":"the user at agent"}`, tip.Key)))
	require.Equal(t, intent.StatusCompleted, b.answer(t, user).Status)
	require.EqualValues(t, 1, userCalls.Load())
	rec := b.record(t, tip.Key)
	require.Equal(t, intent.ControlApprove, rec.Decision.Op)
	require.Equal(t, "the user at agent", rec.Decision.By)
}

// A holder whose lease was taken over while its effect ran never
// overwrites the new holder's record: it answers with its outcome.
func TestStagesLeaseLostBeforeRecording(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, func(int32) (effects.Outcome, error) {
		close(started)
		<-release
		return effects.Outcome{Result: json.RawMessage(`"mine"`), Invocations: 1}, nil
	})})
	id := b.identity(t, "send", `{}`)
	m := b.send(b.intent("send", `{}`))
	waitFor(t, started)
	now := time.Now().UTC()
	b.ledger.set(id.Key, dedup.Record{Status: intent.StatusCompleted, Tool: "send", Fingerprint: id.Fingerprint, Holder: "other",
		Attempt: 2, Attempts: 1, Result: json.RawMessage(`"theirs"`), IntentSeq: 1000, CreatedAt: now, UpdatedAt: now, CompletedAt: now})
	close(release)
	require.Equal(t, verbAck, m.settlement(t).verb)
	res := b.answer(t, m)
	require.JSONEq(t, `"theirs"`, string(res.Result))
	require.True(t, res.Replayed)
	require.JSONEq(t, `"theirs"`, string(b.record(t, id.Key).Result))
}

// A panicking effect gives its key back and its intent is delivered again.
func TestStagesPanickingEffect(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, func(int32) (effects.Outcome, error) { panic("effect bug") })})
	m := b.send(b.intent("send", `{}`))
	require.Equal(t, settlement{verb: verbNak, delay: b.w.cfg.RetryDelay}, m.settlement(t))
	b.unanswered(t, m)
	require.True(t, b.record(t, b.identity(t, "send", `{}`).Key).Released())
}

// An intent that ends unanswered is dead-lettered and answered
// dead_lettered: far past its deliveries (every worker that handled it
// died), or on a nak at its last delivery. A dead letter that cannot be
// copied leaves the intent to redelivery.
func TestStagesDeadLetters(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{MaxDeliver: 2}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	key := b.identity(t, "send", `{}`).Key

	overdue := b.intent("send", `{}`)
	overdue.meta.NumDelivered = 21
	s := b.send(overdue).settlement(t)
	require.Equal(t, settlement{verb: verbTerm, reason: "delivered 21 times (more than 20) without an answer: every worker that handled it stopped first"}, s)
	res := b.answer(t, overdue)
	require.Equal(t, intent.CodeDeadLettered, res.Error.Code)
	require.Equal(t, key, res.Key, "the worker's derivation")

	b.ledger.fault = func(op string) error { return errors.New("the ledger refuses") }
	last := b.intent("send", `{}`)
	last.meta.NumDelivered = 2
	s = b.send(last).settlement(t)
	require.Equal(t, settlement{verb: verbTerm, reason: "max deliveries (2) reached: ledger unavailable"}, s)
	require.Equal(t, intent.CodeDeadLettered, b.answer(t, last).Error.Code)
	require.Len(t, b.letters.all(), 2)

	b.letters.mu.Lock()
	b.letters.fail = errors.New("no dead-letter stream")
	b.letters.mu.Unlock()
	uncopied := b.intent("send", `{}`)
	uncopied.meta.NumDelivered = 21
	require.Equal(t, verbNak, b.send(uncopied).settlement(t).verb)
	b.unanswered(t, uncopied)
	rejected := b.send(b.message(b.names.IntentSubject("send"), `{"tool":`))
	require.Equal(t, verbNak, rejected.settlement(t).verb, "left to redelivery")
	require.Equal(t, intent.StatusRejected, b.answer(t, rejected).Status, "answered all the same")
	require.Zero(t, calls.Load())
}

// An intent waiting under its tool's cap spends no delivery: past the
// consumer's MaxDeliver (its earlier deliveries were redelivered while it
// waited, or its workers stopped) it is served as any other and fires once;
// at its last delivery, a worker that stops while it waits gives it back
// to the stream, unanswered and not dead-lettered.
func TestStagesHeldIntentSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	pol := effects.DefaultPolicy()
	pol.MaxInFlight = 1
	b := newStages(t, Config{MaxDeliver: 2}, &effects.Tool{Name: "send", Policy: pol, Effect: counted(&calls, func(n int32) (effects.Outcome, error) {
		if n == 2 {
			<-release
		}
		return sent(n)
	})})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the worker's cleanup, which waits for the effect

	late := b.intent("send", `{"to":"late"}`)
	late.meta.NumDelivered = 7 // past MaxDeliver: redelivered while it waited
	require.Equal(t, verbAck, b.send(late).settlement(t).verb)
	require.Equal(t, intent.StatusCompleted, b.answer(t, late).Status, "served, and fired")
	require.EqualValues(t, 1, calls.Load())

	firing := b.send(b.intent("send", `{"to":"first"}`)) // holds the tool's only slot
	require.Eventually(t, func() bool { return calls.Load() == 2 }, 10*time.Second, time.Millisecond)
	waiting := b.intent("send", `{"to":"waits"}`)
	waiting.meta.NumDelivered = 2 // its last delivery
	b.send(waiting)
	require.Eventually(t, func() bool { return len(b.w.queued) == 1 },
		10*time.Second, time.Millisecond, "it waits under the cap")
	b.halt()
	s := waiting.settlement(t)
	require.Equal(t, verbNak, s.verb, "given back to the stream, not dead-lettered: %+v", s)
	b.unanswered(t, waiting)
	require.Empty(t, b.letters.all())
	unblock()
	require.Equal(t, verbAck, firing.settlement(t).verb)
	require.EqualValues(t, 2, calls.Load())
}

// An intent is kept alive from its delivery to its settlement, whatever
// stage it is in: waiting under its tool's cap, claiming (a slow ledger),
// firing. The consumer never goes an AckWait without hearing of it — no
// gap between the stages' keep-alives in which the server would deliver it
// again and spend a delivery.
func TestStagesKeepAliveHasNoGap(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second
	pol := effects.DefaultPolicy()
	pol.MaxInFlight = 1
	var calls atomic.Int32
	b := newStages(t, Config{AckWait: ackWait}, &effects.Tool{Name: "send", Policy: pol, Effect: counted(&calls, func(n int32) (effects.Outcome, error) {
		time.Sleep(ackWait / 2)
		return sent(n)
	})})
	b.ledger.fault = func(op string) error {
		if op == "claim" {
			time.Sleep(ackWait) // a claim on a loaded, replicated ledger
		}
		return nil
	}
	start := time.Now()
	first := b.send(b.intent("send", `{"to":"a"}`))
	second := b.send(b.intent("send", `{"to":"b"}`)) // waits under the cap, then claims
	for _, m := range []*memMsg{first, second} {
		require.Equal(t, verbAck, m.settlement(t).verb)
		require.Less(t, m.longestSilence(start), ackWait, "the consumer heard of the intent at least once an AckWait")
	}
	require.EqualValues(t, 2, calls.Load())
}

// A tool without the ledger fires every intent, records nothing.
func TestStagesDirect(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "lookup", Effect: counted(&calls, sent),
		Policy: effects.Policy{Class: intent.ClassRead}})
	for range 2 {
		m := b.send(b.intent("lookup", `{"sku":"a"}`))
		require.Equal(t, verbAck, m.settlement(t).verb)
		require.Equal(t, intent.StatusCompleted, b.answer(t, m).Status)
	}
	require.EqualValues(t, 2, calls.Load())
	require.Zero(t, b.ledger.len())
	require.Equal(t, 2.0, testutil.ToFloat64(b.w.m.fired.WithLabelValues("lookup")))
}

// A tool with on_failure: retry runs a failed operation again at the next
// call of its key, answer cache or not: the failure is never replayed, and
// the effect's invocations keep counting.
func TestStagesRetryFailure(t *testing.T) {
	t.Parallel()
	eachAnswerSource(t, func(t *testing.T, cache time.Duration) {
		var calls atomic.Int32
		pol := effects.DefaultPolicy()
		pol.OnFailure = intent.OnFailureRetry
		b := newStages(t, Config{AnswerCache: cache}, &effects.Tool{Name: "send", Policy: pol, Effect: counted(&calls, func(n int32) (effects.Outcome, error) {
			if n == 1 {
				return effects.Outcome{Invocations: 1}, effects.Permanent(intent.CodeEffectFailed, "422 mailbox full")
			}
			return sent(n)
		})})
		first := b.send(b.intent("send", `{"to":"a"}`))
		require.Equal(t, verbAck, first.settlement(t).verb)
		require.Equal(t, intent.StatusFailed, b.answer(t, first).Status)

		again := b.send(b.intent("send", `{"to":"a"}`))
		require.Equal(t, verbAck, again.settlement(t).verb)
		res := b.answer(t, again)
		require.Equal(t, intent.StatusCompleted, res.Status, "the next call runs again")
		require.False(t, res.Replayed)
		require.Equal(t, 2, res.Attempts)
		require.EqualValues(t, 2, calls.Load())
		rec := b.record(t, res.Key)
		require.Equal(t, 2, rec.Attempt)
		require.Equal(t, again.meta.Sequence.Stream, rec.IntentSeq)

		done := b.send(b.intent("send", `{"to":"a"}`))
		require.Equal(t, verbAck, done.settlement(t).verb)
		require.True(t, b.answer(t, done).Replayed, "a completion is replayed as ever")
		require.EqualValues(t, 2, calls.Load())
	})
}

// A tool with on_failure: retry runs a failed operation again only for a
// new call: the failed message delivered again and a copy of the call that
// failed (another message naming the same call) are answered with the
// failure, its own call's (no replay), and fire nothing; a malformed call
// name is rejected.
func TestStagesRetryFailureNotForACopy(t *testing.T) {
	t.Parallel()
	eachAnswerSource(t, func(t *testing.T, cache time.Duration) {
		var calls atomic.Int32
		pol := effects.DefaultPolicy()
		pol.OnFailure = intent.OnFailureRetry
		b := newStages(t, Config{AnswerCache: cache}, &effects.Tool{Name: "send", Policy: pol, Effect: counted(&calls, func(n int32) (effects.Outcome, error) {
			if n == 1 {
				return effects.Outcome{Invocations: 1}, effects.Permanent(intent.CodeEffectFailed, "422 mailbox full")
			}
			return sent(n)
		})})
		named := func(call string) *memMsg {
			m := b.intent("send", `{"to":"a"}`)
			m.header.Set(intent.HeaderSubmission, call)
			return m
		}
		first := b.send(named("call-aaaaaaaa"))
		require.Equal(t, verbAck, first.settlement(t).verb)
		require.Equal(t, intent.StatusFailed, b.answer(t, first).Status)

		redelivered := b.send(first.again())
		require.Equal(t, verbAck, redelivered.settlement(t).verb)
		copyOf := b.send(named("call-aaaaaaaa"))
		require.Equal(t, verbAck, copyOf.settlement(t).verb)
		res := b.answer(t, copyOf)
		require.Equal(t, intent.StatusFailed, res.Status, "a copy of the call that failed gets its failure")
		require.False(t, res.Replayed, "its own call's")
		require.EqualValues(t, 1, calls.Load(), "neither the redelivery nor the copy fires")

		bad := b.send(named("x y"))
		require.Equal(t, verbTerm, bad.settlement(t).verb)
		rej := b.answer(t, bad)
		require.Equal(t, intent.CodeInvalidIntent, rej.Error.Code)
		require.Contains(t, rej.Error.Message, intent.HeaderSubmission)

		next := b.send(named("call-bbbbbbbb"))
		require.Equal(t, verbAck, next.settlement(t).verb)
		res = b.answer(t, next)
		require.Equal(t, intent.StatusCompleted, res.Status, "a new call runs it again")
		require.EqualValues(t, 2, calls.Load())
		require.Equal(t, []string{"call-aaaaaaaa", "call-bbbbbbbb"}, b.record(t, res.Key).Submissions)
	})
}

// A tool with on_complete: reject answers a repeat of a completed operation
// already_done, with what ran, and never fires it; the same call delivered
// again is answered its own outcome, and a failure is replayed as ever.
func TestStagesRejectRepeat(t *testing.T) {
	t.Parallel()
	eachAnswerSource(t, func(t *testing.T, cache time.Duration) {
		var calls atomic.Int32
		pol := effects.DefaultPolicy()
		pol.OnComplete = intent.OnCompleteReject
		b := newStages(t, Config{AnswerCache: cache}, &effects.Tool{Name: "send", Policy: pol, Effect: counted(&calls, func(n int32) (effects.Outcome, error) {
			if n == 2 {
				return effects.Outcome{Invocations: 1}, effects.Permanent(intent.CodeEffectFailed, "422 mailbox full")
			}
			return sent(n)
		})})
		first := b.send(b.intent("send", `{"to":"a"}`))
		require.Equal(t, verbAck, first.settlement(t).verb)
		ran := b.answer(t, first)
		require.Equal(t, intent.StatusCompleted, ran.Status)

		repeat := b.send(b.intent("send", `{"to":"a"}`))
		require.Equal(t, verbAck, repeat.settlement(t).verb)
		res := b.answer(t, repeat)
		require.Equal(t, intent.StatusAlreadyDone, res.Status)
		require.Equal(t, intent.CodeAlreadyDone, res.Error.Code)
		require.True(t, res.Replayed)
		require.JSONEq(t, `"sent"`, string(res.Result), "it carries what ran")
		require.Equal(t, ran.CompletedAt, res.CompletedAt)
		require.Equal(t, 1, res.Attempts)
		require.EqualValues(t, 1, calls.Load(), "a rejected repeat never fires")

		own := b.send(first.again())
		require.Equal(t, verbAck, own.settlement(t).verb)
		require.Equal(t, intent.StatusCompleted, b.answer(t, own).Status, "the same call's own outcome")

		failing := b.send(b.intent("send", `{"to":"b"}`))
		require.Equal(t, verbAck, failing.settlement(t).verb)
		require.Equal(t, intent.StatusFailed, b.answer(t, failing).Status)
		failedAgain := b.send(b.intent("send", `{"to":"b"}`))
		require.Equal(t, verbAck, failedAgain.settlement(t).verb)
		require.Equal(t, intent.StatusFailed, b.answer(t, failedAgain).Status, "a failure is replayed")
		require.EqualValues(t, 2, calls.Load())
	})
}

// eachAnswerSource runs fn as parallel subtests, with the workers' answer
// cache on and with it off (every answer read from the ledger).
func eachAnswerSource(t *testing.T, fn func(t *testing.T, cache time.Duration)) {
	for _, c := range []struct {
		name  string
		cache time.Duration
	}{{"answer cache", 0}, {"ledger", NoAnswerCache}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fn(t, c.cache)
		})
	}
}
