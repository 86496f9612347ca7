package integration

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// relay is a real SMTP server recording every message; answer, when set,
// gives the reply to transaction n's end of data.
type relay struct {
	addr   string
	mu     sync.Mutex
	txns   int
	msgs   []*mail.Message
	answer func(n int) error
}

func (r *relay) messages() []*mail.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*mail.Message(nil), r.msgs...)
}

type relaySession struct{ r *relay }

func (s relaySession) AuthPlain(string, string) error         { return nil }
func (s relaySession) Mail(string, *gosmtp.MailOptions) error { return nil }
func (s relaySession) Rcpt(string, *gosmtp.RcptOptions) error { return nil }
func (s relaySession) Reset()                                 {}
func (s relaySession) Logout() error                          { return nil }
func (s relaySession) Data(rd io.Reader) error {
	msg, err := mail.ReadMessage(rd)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, msg.Body)
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	n := s.r.txns
	s.r.txns++
	if s.r.answer != nil {
		if err := s.r.answer(n); err != nil {
			return err
		}
	}
	s.r.msgs = append(s.r.msgs, msg)
	return nil
}

func startRelay(t *testing.T, answer func(n int) error) *relay {
	t.Helper()
	r := &relay{answer: answer}
	srv := gosmtp.NewServer(gosmtp.BackendFunc(func(*gosmtp.Conn) (gosmtp.Session, error) { return relaySession{r}, nil }))
	srv.Domain = "relay.test"
	srv.ErrorLog = log.New(io.Discard, "", 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

// An email tool through a real SMTP relay: the repeat sends nothing; a relay
// that answers 451 once gets the same Message-ID again.
func TestEmailToolThroughARealRelay(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	mailer := startRelay(t, func(n int) error {
		if n == 0 {
			return &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 3, 0}, Message: "try again"}
		}
		return nil
	})
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  send_email:
    effect: smtp
    key_args: [to, subject]
    smtp:
      addr: %s
      from: "Shop <shop@example.com>"
      starttls: "off"
      retry: {max_attempts: 3, initial_interval: 50ms, max_interval: 100ms}
`, mailer.addr)))
	args := `{"to":"ada@example.com","subject":"Your order shipped","text":"It is on its way."}`
	first := submit(t, url, "--tool", "send_email", "--args", args, "--wait", "30s")
	require.Equal(t, 0, first.code, first.stdout+first.stderr)
	require.Equal(t, 2, first.res.Attempts, "451, then accepted")
	again := submit(t, url, "--tool", "send_email", "--args", args, "--wait", "30s")
	require.Equal(t, 3, again.code)

	msgs := mailer.messages()
	require.Len(t, msgs, 1, "one message delivered")
	require.Equal(t, 2, mailer.txns, "two transactions, the first refused")
	require.Equal(t, first.res.Key, msgs[0].Header.Get("Idempotency-Key"))
	require.Contains(t, msgs[0].Header.Get("Message-Id"), "@example.com>")
	require.Contains(t, string(first.res.Result), strings.Trim(msgs[0].Header.Get("Message-Id"), "<>"), "the answer names the Message-ID")
	require.Equal(t, "Your order shipped", msgs[0].Header.Get("Subject"))
}

// A tool written as a NATS service (a nats.go micro service here): called
// once with the key in its headers; a 4xx error is a permanent failure.
func TestNATSServiceToolThroughAMicroService(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	nc := connect(t, url)
	var mu sync.Mutex
	var keys []string
	svc, err := micro.AddService(nc, micro.Config{Name: "billing", Version: "1.0.0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	require.NoError(t, svc.AddEndpoint("charge", micro.HandlerFunc(func(req micro.Request) {
		mu.Lock()
		keys = append(keys, nats.Header(req.Headers()).Get("Idempotency-Key"))
		mu.Unlock()
		if strings.Contains(string(req.Data()), "declined") {
			_ = req.Error("400", "card declined", nil)
			return
		}
		_ = req.Respond([]byte(`{"charge":"ch_1"}`))
	}), micro.WithEndpointSubject("billing.charge")))
	require.NoError(t, nc.Flush())
	startWorker(t, "w1", url, writeTools(t, `tools:
  charge:
    effect: nats
    key_args: [order]
    nats: {subject: billing.charge, timeout: 5s}
`))

	ok := submit(t, url, "--tool", "charge", "--args", `{"order":"o-1","cents":500}`, "--wait", "30s")
	require.Equal(t, 0, ok.code, ok.stdout+ok.stderr)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(ok.res.Result))
	require.Equal(t, 3, submit(t, url, "--tool", "charge", "--args", `{"order":"o-1","cents":500}`, "--wait", "30s").code)

	declined := submit(t, url, "--tool", "charge", "--args", `{"order":"o-2","card":"declined"}`, "--wait", "30s")
	require.Equal(t, 5, declined.code, declined.stdout+declined.stderr)
	require.Equal(t, intent.StatusFailed, declined.res.Status)
	require.Contains(t, declined.res.Error.Message, "card declined")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{ok.res.Key, declined.res.Key}, keys, "one call per operation, each with its key")
}
