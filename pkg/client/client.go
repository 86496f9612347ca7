package client

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/audit"
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
	// ErrAlreadyDone matches (errors.Is) AnswerErr's error for an
	// already_done answer: the operation ran before and its tool refuses a
	// repeat (intent.OnCompleteReject); nothing fired, and the answer
	// carries the recorded result.
	ErrAlreadyDone = errors.New("client: operation already done")
	// ErrForgotten: while Watch or WatchFinal watched the key, an operator
	// forgot the operation; the returned record is the forgotten one (who,
	// when, why: dedup.Record.ForgottenText). Its next call runs it again.
	ErrForgotten = errors.New("client: operation forgotten")
)

// AnswerError is an answer that reports an error (a failure, a conflict, a
// denial, a rejection, already_done), as a Go error. An answer is a result:
// Submit returns it with a nil error; AnswerErr turns it into this for
// callers that handle such answers as errors.
type AnswerError struct {
	// Result is the answer.
	Result *intent.Result
}

// Error says the answer's key, status, code and message.
func (e *AnswerError) Error() string {
	return fmt.Sprintf("client: %s %s: %s: %s", e.Result.Key, e.Result.Status, e.Result.Error.Code, e.Result.Error.Message)
}

// Is matches ErrAlreadyDone for an already_done answer.
func (e *AnswerError) Is(target error) bool {
	return target == ErrAlreadyDone && e.Result.Error.Code == intent.CodeAlreadyDone
}

// AnswerErr returns res as an *AnswerError when it carries an error, nil
// otherwise (completed, awaiting approval, uncertain, or res nil). Match an
// already_done answer with errors.Is(err, ErrAlreadyDone).
func AnswerErr(res *intent.Result) error {
	if res == nil || res.Error == nil || res.Status == intent.StatusUncertain {
		return nil
	}
	return &AnswerError{Result: res}
}

// DefaultReplyGrace is how long a submission waits for the pushed reply before
// it also watches the ledger key.
const DefaultReplyGrace = 3 * time.Second

type options struct {
	prefix      string
	specs       map[string]toolSpec
	replyGrace  time.Duration
	receiptKeys *audit.KeySet
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
	nc    *nats.Conn
	js    jetstream.JetStream
	names intent.Names
	grace time.Duration
	mu    sync.Mutex
	specs map[string]toolSpec
	// ledger is the client's one ledger, which it reads and Forget writes
	// with, opened on first use and again after a migration changed its
	// shape; shapeAt is when the latest look that found its shape to be the
	// ledger's began. shapeMu serialises those looks.
	ledger  *dedup.Ledger
	shapeAt time.Time
	shapeMu sync.Mutex
	// receiptKeys verify answers' receipts (WithReceiptKeys); nil: none.
	receiptKeys *audit.KeySet
	// cat is the workers' tool catalogue as the client remembers it.
	cat *catalogue
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
	c := &Client{nc: nc, js: js, names: names, grace: o.replyGrace, specs: o.specs, receiptKeys: o.receiptKeys}
	c.cat = &catalogue{fetch: c.Tools}
	return c, nil
}

// Names returns the names the client uses.
func (c *Client) Names() intent.Names { return c.names }
