package smtp_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	gosmtp "github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/smtp"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

var (
	_ effects.Effect  = (*smtp.Effect)(nil)
	_ effects.Bounded = (*smtp.Effect)(nil)
)

// delivered is one message as the test relay received it.
type delivered struct {
	txn   int // the transaction that carried it, 0-based
	from  string
	rcpts []string
	data  []byte
	tls   bool
	user  string
}

// mailBundle is a real SMTP relay (go-smtp) that records what it receives
// and answers as a test scripts it.
type mailBundle struct {
	addr string
	// reply, when set, is asked at each step of transaction n ("MAIL",
	// "RCPT <addr>", "DATA" after the message was read) and its error, an
	// *gosmtp.SMTPError, is the relay's answer.
	reply func(n int, step string) error
	// users, when set, makes the relay require AUTH PLAIN with these
	// credentials.
	users map[string]string

	txns atomic.Int32
	mu   sync.Mutex
	msgs []delivered
	// envelope is every MAIL FROM and RCPT TO the relay accepted, as it
	// parsed them: "MAIL <from>", "RCPT <to> NOTIFY=... ORCPT=...".
	envelope []string
	// data gets a value for every message read, before the relay answers.
	data chan int
}

func (b *mailBundle) delivered() []delivered {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]delivered(nil), b.msgs...)
}

type mailOption func(*mailBundle, *gosmtp.Server)

// withTLS makes the relay offer STARTTLS with cert.
func withTLS(cert tls.Certificate) mailOption {
	return func(_ *mailBundle, s *gosmtp.Server) {
		s.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
}

// withUsers makes the relay require AUTH PLAIN; insecure allows it without
// TLS (net/smtp still sends it only to localhost).
func withUsers(users map[string]string, insecure bool) mailOption {
	return func(b *mailBundle, s *gosmtp.Server) {
		b.users = users
		s.AllowInsecureAuth = insecure
	}
}

// withDSN makes the relay offer DSN (RFC 3461): it then takes NOTIFY and
// ORCPT parameters on RCPT TO.
func withDSN() mailOption {
	return func(_ *mailBundle, s *gosmtp.Server) { s.EnableDSN = true }
}

func (b *mailBundle) envelopeSeen() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.envelope...)
}

func withReply(reply func(n int, step string) error) mailOption {
	return func(b *mailBundle, _ *gosmtp.Server) { b.reply = reply }
}

// setupMail starts a relay on a loopback port and stops it in t.Cleanup.
func setupMail(t *testing.T, opts ...mailOption) *mailBundle {
	t.Helper()
	b := &mailBundle{data: make(chan int, 100)}
	srv := gosmtp.NewServer(gosmtp.BackendFunc(func(c *gosmtp.Conn) (gosmtp.Session, error) {
		s := &mailSession{b: b, conn: c}
		if b.users != nil {
			return &authMailSession{s}, nil
		}
		return s, nil
	}))
	srv.Domain = "relay.test"
	srv.ReadTimeout = 10 * time.Second
	srv.WriteTimeout = 10 * time.Second
	srv.ErrorLog = log.New(io.Discard, "", 0)
	for _, o := range opts {
		o(b, srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b.addr = l.Addr().String()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		<-served
	})
	return b
}

type mailSession struct {
	b     *mailBundle
	conn  *gosmtp.Conn
	txn   int
	from  string
	rcpts []string
	user  string
}

func (s *mailSession) answer(step string) error {
	if s.b.reply == nil {
		return nil
	}
	return s.b.reply(s.txn, step)
}

func (s *mailSession) Mail(from string, _ *gosmtp.MailOptions) error {
	if s.b.users != nil && s.user == "" {
		return gosmtp.ErrAuthRequired
	}
	s.txn = int(s.b.txns.Add(1)) - 1
	s.from = from
	s.b.mu.Lock()
	s.b.envelope = append(s.b.envelope, "MAIL "+from)
	s.b.mu.Unlock()
	return s.answer("MAIL")
}

func (s *mailSession) Rcpt(to string, opts *gosmtp.RcptOptions) error {
	if err := s.answer("RCPT " + to); err != nil {
		return err
	}
	s.rcpts = append(s.rcpts, to)
	seen := "RCPT " + to
	if opts != nil && len(opts.Notify) > 0 {
		seen += fmt.Sprintf(" NOTIFY=%v", opts.Notify)
	}
	if opts != nil && opts.OriginalRecipient != "" {
		seen += fmt.Sprintf(" ORCPT=%s;%s", opts.OriginalRecipientType, opts.OriginalRecipient)
	}
	s.b.mu.Lock()
	s.b.envelope = append(s.b.envelope, seen)
	s.b.mu.Unlock()
	return nil
}

func (s *mailSession) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	_, isTLS := s.conn.TLSConnectionState()
	s.b.mu.Lock()
	s.b.msgs = append(s.b.msgs, delivered{txn: s.txn, from: s.from, rcpts: s.rcpts, data: data, tls: isTLS, user: s.user})
	s.b.mu.Unlock()
	s.b.data <- s.txn
	return s.answer("DATA")
}

func (s *mailSession) Reset()        { s.from, s.rcpts = "", nil }
func (s *mailSession) Logout() error { return nil }

type authMailSession struct{ *mailSession }

func (s *authMailSession) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *authMailSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, username, password string) error {
		if want, ok := s.b.users[username]; !ok || want != password {
			return gosmtp.ErrAuthFailed
		}
		s.user = username
		return nil
	}), nil
}

func smtpErr(code int, msg string) error {
	return &gosmtp.SMTPError{Code: code, EnhancedCode: gosmtp.EnhancedCodeNotSet, Message: msg}
}

// newSMTP builds an smtp effect with fast retries unless cfg says otherwise.
func newSMTP(t *testing.T, cfg smtp.Config) *smtp.Effect {
	t.Helper()
	if cfg.From == "" {
		cfg.From = "Billing <billing@example.com>"
	}
	if cfg.Retry.InitialInterval == 0 {
		cfg.Retry.InitialInterval = time.Millisecond
	}
	if cfg.Retry.MaxInterval == 0 {
		cfg.Retry.MaxInterval = 5 * time.Millisecond
	}
	s, err := smtp.New(cfg)
	require.NoError(t, err)
	return s
}

var mailCall = effects.Call{
	Key:     "send_email.8c1f0e",
	Tool:    "send_email",
	Session: "run-7",
	CallID:  "call_abc",
	Args: json.RawMessage(`{"bcc":"audit@example.com","cc":["Carl <carl@example.com>","ann@example.com"],` +
		`"subject":"Your invoice","text":"Hello Ann,\nyour invoice is attached.\n.\nBye","to":"Ann <ann@example.com>"}`),
	Attempt: 1,
}

// readMail parses a delivered message.
func readMail(t *testing.T, d delivered) *mail.Message {
	t.Helper()
	m, err := mail.ReadMessage(bytes.NewReader(d.data))
	require.NoError(t, err)
	return m
}

func decodeQP(t *testing.T, r io.Reader) string {
	t.Helper()
	data, err := io.ReadAll(quotedprintable.NewReader(r))
	require.NoError(t, err)
	return string(data)
}

type mailResult struct {
	MessageID string   `json:"message_id"`
	Accepted  []string `json:"accepted"`
	SMTP      string   `json:"smtp"`
}

// An address whose quoted local part holds "> NOTIFY=... ORCPT=..." would,
// written unquoted in RCPT TO, end the path early and give the relay
// another recipient (and DSN parameters) than the To header shows. The
// relay receives no envelope command at all: nothing is sent.
func TestSMTPRefusesAddressesThatBreakTheEnvelope(t *testing.T) {
	t.Parallel()
	b := setupMail(t, withDSN())
	s := newSMTP(t, smtp.Config{Addr: b.addr})
	for _, to := range []string{
		`"victim@evil.example> NOTIFY=SUCCESS ORCPT=rfc822;x"@good.example`,
		`"a b"@good.example`,
		`"victim@evil.example>"@good.example`,
		`ann@good_example.com`,
	} {
		call := mailCall
		call.Args = json.RawMessage(fmt.Sprintf(`{"to":%q,"subject":"hi"}`, to))
		out, err := s.Fire(context.Background(), call)
		pe, ok := effects.IsPermanent(err)
		require.True(t, ok, "%s: %v", to, err)
		require.Contains(t, pe.Message, "cannot be sent", to)
		require.Zero(t, out.Invocations, "%s: no transaction was started", to)
	}
	require.Empty(t, b.envelopeSeen(), "the relay saw no MAIL FROM or RCPT TO")
	require.Zero(t, b.txns.Load())

	// Plain addresses, tags and address literals go through as they are.
	call := mailCall
	call.Args = json.RawMessage(`{"to":["Ann <ann.lee+billing@good.example>","ops@[192.0.2.1]"],"subject":"hi"}`)
	_, err := s.Fire(context.Background(), call)
	require.NoError(t, err)
	require.Equal(t, []string{"MAIL billing@example.com", "RCPT ann.lee+billing@good.example", "RCPT ops@[192.0.2.1]"}, b.envelopeSeen())

	_, err = smtp.New(smtp.Config{Addr: b.addr, From: `"billing@evil.example> RET=FULL"@example.com`})
	require.ErrorContains(t, err, "cannot be sent as the envelope sender")
}

func TestSMTPSendsTheMessage(t *testing.T) {
	t.Parallel()
	b := setupMail(t) // no STARTTLS offered: the default policy sends in the clear
	s := newSMTP(t, smtp.Config{Addr: b.addr})

	out, err := s.Fire(context.Background(), mailCall)
	require.NoError(t, err)
	require.Equal(t, 1, out.Invocations)
	var res mailResult
	require.NoError(t, json.Unmarshal(out.Result, &res))
	wantID := s.MessageID(mailCall.Tool, mailCall.Key)
	require.Regexp(t, `^<send_email\.[0-9a-f]{32}@example\.com>$`, wantID)
	require.Equal(t, wantID, res.MessageID)
	require.Equal(t, []string{"ann@example.com", "carl@example.com", "audit@example.com"}, res.Accepted, "to, cc and bcc, each once")
	require.Regexp(t, `^250 `, res.SMTP)
	require.Contains(t, string(out.Result), `"<send_email.`, "the result is not HTML-escaped")

	msgs := b.delivered()
	require.Len(t, msgs, 1)
	d := msgs[0]
	require.Equal(t, "billing@example.com", d.from)
	require.Equal(t, res.Accepted, d.rcpts)
	require.False(t, d.tls)

	m := readMail(t, d)
	h := m.Header
	require.Equal(t, `"Billing" <billing@example.com>`, h.Get("From"))
	require.Equal(t, `"Ann" <ann@example.com>`, h.Get("To"))
	require.Equal(t, `"Carl" <carl@example.com>, <ann@example.com>`, h.Get("Cc"))
	require.Empty(t, h.Get("Bcc"), "bcc recipients are in no header")
	require.NotContains(t, string(d.data), "audit@example.com")
	require.Equal(t, "Your invoice", h.Get("Subject"))
	require.Equal(t, wantID, h.Get("Message-ID"))
	require.Equal(t, mailCall.Key, h.Get("Idempotency-Key"))
	require.Equal(t, "send_email", h.Get("X-Idem-Tool"))
	require.Equal(t, "1.0", h.Get("MIME-Version"))
	require.Equal(t, "text/plain; charset=utf-8", h.Get("Content-Type"))
	require.Equal(t, "quoted-printable", h.Get("Content-Transfer-Encoding"))
	date, err := h.Date()
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), date, time.Minute)
	require.Equal(t, "Hello Ann,\r\nyour invoice is attached.\r\n.\r\nBye", strings.TrimSuffix(decodeQP(t, m.Body), "\r\n"), "a lone dot survives dot-stuffing")
}

func TestSMTPMultipartAndEncodedSubject(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr})
	subject := "Grüße aus Köln — Ihre Rechnung Nr. 2024-0042 ist da, bitte prüfen Sie die Beträge sorgfältig"
	args, err := json.Marshal(map[string]any{
		"to":      []string{"Jürgen Groß <j@example.com>"},
		"subject": subject + "\r\nBcc: evil@example.com",
		"text":    "Grüße",
		"html":    "<p>Grüße</p>",
	})
	require.NoError(t, err)

	_, err = s.Fire(context.Background(), effects.Call{Key: "send_email.1", Tool: "send_email", Args: args})
	require.NoError(t, err)
	d := b.delivered()[0]
	require.Equal(t, []string{"j@example.com"}, d.rcpts)
	for line := range strings.SplitSeq(string(d.data), "\r\n") {
		require.LessOrEqual(t, len(line), 998, "line %q", line)
		require.True(t, isASCIIString(line), "line %q is not ASCII", line)
	}
	require.Contains(t, string(d.data), "?=\r\n =?utf-8?q?", "the encoded subject is folded between encoded words")
	m := readMail(t, d)
	dec := new(mime.WordDecoder)
	gotSubject, err := dec.DecodeHeader(m.Header.Get("Subject"))
	require.NoError(t, err)
	require.Equal(t, subject+"  Bcc: evil@example.com", gotSubject, "line breaks become spaces: no header injection")
	require.Empty(t, m.Header.Get("Bcc"))
	to, err := m.Header.AddressList("To")
	require.NoError(t, err)
	require.Equal(t, "Jürgen Groß", to[0].Name)

	mediaType, params, err := mime.ParseMediaType(m.Header.Get("Content-Type"))
	require.NoError(t, err)
	require.Equal(t, "multipart/alternative", mediaType)
	mr := multipart.NewReader(m.Body, params["boundary"])
	var parts []string
	for {
		p, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Equal(t, "quoted-printable", p.Header.Get("Content-Transfer-Encoding"))
		parts = append(parts, p.Header.Get("Content-Type")+" "+decodeQP(t, p))
	}
	require.Equal(t, []string{"text/plain; charset=utf-8 Grüße", "text/html; charset=utf-8 <p>Grüße</p>"}, parts)

	// The message is the same on every attempt, but for its Date.
	_, err = s.Fire(context.Background(), effects.Call{Key: "send_email.1", Tool: "send_email", Args: args})
	require.NoError(t, err)
	again := b.delivered()[1]
	require.Equal(t, withoutDate(d.data), withoutDate(again.data))
}

func TestSMTPHTMLOnly(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr})
	_, err := s.Fire(context.Background(), effects.Call{Key: "k", Tool: "t", Args: json.RawMessage(`{"html":"<b>hi</b>","to":"a@example.com"}`)})
	require.NoError(t, err)
	m := readMail(t, b.delivered()[0])
	require.Equal(t, "text/html; charset=utf-8", m.Header.Get("Content-Type"))
	require.Empty(t, m.Header.Get("Subject"))
	require.Equal(t, "<b>hi</b>", strings.TrimSuffix(decodeQP(t, m.Body), "\r\n"))
}

func withoutDate(data []byte) string {
	var lines []string
	for line := range strings.SplitSeq(string(data), "\r\n") {
		if !strings.HasPrefix(line, "Date: ") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\r\n")
}

func isASCIIString(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func TestSMTPMessageIDStableAcrossRetries(t *testing.T) {
	t.Parallel()
	b := setupMail(t, withReply(func(n int, step string) error {
		if n == 0 && step == "DATA" {
			return smtpErr(451, "Try again later")
		}
		return nil
	}))
	s := newSMTP(t, smtp.Config{Addr: b.addr})

	out, err := s.Fire(context.Background(), mailCall)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations, "two SMTP transactions")
	msgs := b.delivered()
	require.Len(t, msgs, 2, "the relay read the message twice and kept the second")
	first, second := readMail(t, msgs[0]), readMail(t, msgs[1])
	require.Equal(t, first.Header.Get("Message-ID"), second.Header.Get("Message-ID"))
	require.Equal(t, mailCall.Key, second.Header.Get("Idempotency-Key"))
	var res mailResult
	require.NoError(t, json.Unmarshal(out.Result, &res))
	require.Equal(t, first.Header.Get("Message-ID"), res.MessageID)
}

func TestSMTPTransientReplies(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"MAIL", "RCPT ann@example.com", "DATA"} {
		t.Run(strings.Fields(step)[0], func(t *testing.T) {
			t.Parallel()
			b := setupMail(t, withReply(func(n int, s string) error {
				if n == 0 && s == step {
					return smtpErr(452, "Busy")
				}
				return nil
			}))
			s := newSMTP(t, smtp.Config{Addr: b.addr})
			out, err := s.Fire(context.Background(), mailCall)
			require.NoError(t, err)
			require.Equal(t, 2, out.Invocations)
		})
	}
}

func TestSMTPTransientExhausted(t *testing.T) {
	t.Parallel()
	b := setupMail(t, withReply(func(int, string) error { return smtpErr(421, "Service shutting down") }))
	s := newSMTP(t, smtp.Config{Addr: b.addr, Retry: effects.RetryPolicy{MaxAttempts: 3}})
	out, err := s.Fire(context.Background(), mailCall)
	require.Equal(t, 3, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "after 3 transactions")
	require.ErrorContains(t, err, "MAIL FROM answered 421 4.0.0 Service shutting down")
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

func TestSMTPRejectionIsPermanent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		step, want string
	}{
		{"RCPT carl@example.com", "RCPT TO:<carl@example.com> answered 550 5.1.1 No such user"},
		{"DATA", "the end of the message answered 550 5.1.1 No such user"},
	} {
		t.Run(strings.Fields(tc.step)[0], func(t *testing.T) {
			t.Parallel()
			b := setupMail(t, withReply(func(_ int, step string) error {
				if step == tc.step {
					return &gosmtp.SMTPError{Code: 550, EnhancedCode: gosmtp.EnhancedCode{5, 1, 1}, Message: "No such user"}
				}
				return nil
			}))
			s := newSMTP(t, smtp.Config{Addr: b.addr})
			out, err := s.Fire(context.Background(), mailCall)
			require.Equal(t, 1, out.Invocations, "one transaction")
			pe, ok := effects.IsPermanent(err)
			require.True(t, ok, "err: %v", err)
			require.Equal(t, "effect_failed", pe.Code)
			require.Contains(t, pe.Message, tc.want)
			require.Equal(t, int32(1), b.txns.Load())
		})
	}
}

// testCA is a private CA and a relay certificate it signed for 127.0.0.1.
type testCA struct {
	caFile string
	cert   tls.Certificate
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idemgate test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "relay.test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, &key.PublicKey, caKey)
	require.NoError(t, err)

	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	return testCA{caFile: caFile, cert: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}}
}

// parseTool parses a one-tool file and returns the tool.
func parseTool(t *testing.T, file string, opts ...toolsfile.Option) *effects.Tool {
	t.Helper()
	r := parse(t, file, opts...)
	names := r.Names()
	require.Len(t, names, 1)
	tool, _ := r.Lookup(names[0])
	return tool
}

func TestSMTPStartTLSRequired(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	b := setupMail(t, withTLS(ca.cert))
	tool := parseTool(t, fmt.Sprintf(`tools:
  send_email:
    effect: smtp
    key_args: [to, subject]
    smtp:
      addr: %s
      from: billing@example.com
      starttls: required
      ca_file: %s
      retry: {initial_interval: 1ms, max_interval: 1ms}
`, b.addr, ca.caFile))

	out, err := tool.Effect.Fire(context.Background(), mailCall)
	require.NoError(t, err)
	require.Equal(t, 1, out.Invocations)
	require.True(t, b.delivered()[0].tls, "the message travelled over TLS")
}

func TestSMTPStartTLSOpportunisticVerifies(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	b := setupMail(t, withTLS(ca.cert))

	// Offered and verified: used.
	s := newSMTP(t, smtp.Config{Addr: b.addr, CAFile: ca.caFile})
	_, err := s.Fire(context.Background(), mailCall)
	require.NoError(t, err)
	require.True(t, b.delivered()[0].tls)

	// Offered but not verifiable: an error, never plain text.
	s = newSMTP(t, smtp.Config{Addr: b.addr, Retry: effects.RetryPolicy{MaxAttempts: 2}})
	out, err := s.Fire(context.Background(), mailCall)
	require.Equal(t, 2, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "STARTTLS")
	require.ErrorContains(t, err, "set ca_file")
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
	require.Len(t, b.delivered(), 1, "nothing more was sent")
}

func TestSMTPStartTLSRequiredButNotOffered(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr, StartTLS: smtp.StartTLSRequired, Retry: effects.RetryPolicy{MaxAttempts: 2}})
	out, err := s.Fire(context.Background(), mailCall)
	require.Equal(t, 2, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "does not offer STARTTLS")
	require.Empty(t, b.delivered())
	require.Equal(t, int32(0), b.txns.Load(), "no MAIL FROM in the clear")
}

func TestSMTPAuth(t *testing.T) {
	t.Parallel()
	// t.Setenv cannot be used in a parallel test; the name is unique to it.
	const env = "IDEMGATE_TEST_SMTP_AUTH_PASSWORD"
	require.NoError(t, os.Setenv(env, "s3cret-pw"))
	t.Cleanup(func() { _ = os.Unsetenv(env) })
	const wrongEnv = "IDEMGATE_TEST_SMTP_AUTH_WRONG"
	require.NoError(t, os.Setenv(wrongEnv, "wr0ng-pw"))
	t.Cleanup(func() { _ = os.Unsetenv(wrongEnv) })

	file := func(addr, passwordEnv, extra string) string {
		return fmt.Sprintf(`tools:
  send_email:
    effect: smtp
    key_args: [to, subject]
    smtp:
      addr: %s
      from: billing@example.com
      username: mailer
      password_env: %s
      retry: {initial_interval: 1ms, max_interval: 1ms}
%s`, addr, passwordEnv, extra)
	}

	t.Run("LocalhostInTheClear", func(t *testing.T) {
		t.Parallel()
		b := setupMail(t, withUsers(map[string]string{"mailer": "s3cret-pw"}, true))
		tool := parseTool(t, file(b.addr, env, ""))
		out, err := tool.Effect.Fire(context.Background(), mailCall)
		require.NoError(t, err)
		require.Equal(t, 1, out.Invocations)
		require.Equal(t, "mailer", b.delivered()[0].user)
		require.NotContains(t, string(out.Result), "s3cret")
	})
	t.Run("OverTLS", func(t *testing.T) {
		t.Parallel()
		ca := newTestCA(t)
		b := setupMail(t, withTLS(ca.cert), withUsers(map[string]string{"mailer": "s3cret-pw"}, false))
		tool := parseTool(t, file(b.addr, env, "      starttls: required\n      ca_file: "+ca.caFile+"\n"))
		_, err := tool.Effect.Fire(context.Background(), mailCall)
		require.NoError(t, err)
		d := b.delivered()[0]
		require.True(t, d.tls)
		require.Equal(t, "mailer", d.user)
	})
	t.Run("WrongPasswordIsPermanent", func(t *testing.T) {
		t.Parallel()
		b := setupMail(t, withUsers(map[string]string{"mailer": "s3cret-pw"}, true))
		tool := parseTool(t, file(b.addr, wrongEnv, ""))
		out, err := tool.Effect.Fire(context.Background(), mailCall)
		require.Equal(t, 1, out.Invocations)
		pe, ok := effects.IsPermanent(err)
		require.True(t, ok, "err: %v", err)
		require.Contains(t, pe.Message, "AUTH answered 535")
		require.NotContains(t, err.Error(), "wr0ng")
		require.Empty(t, b.delivered())
	})
	t.Run("RelayOffersNoAuth", func(t *testing.T) {
		t.Parallel()
		b := setupMail(t)
		tool := parseTool(t, file(b.addr, env, ""))
		out, err := tool.Effect.Fire(context.Background(), mailCall)
		require.Equal(t, 4, out.Invocations)
		require.ErrorIs(t, err, effects.ErrExhausted)
		require.ErrorContains(t, err, "does not offer AUTH")
	})
}

func TestSMTPConnectionRefused(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	s := newSMTP(t, smtp.Config{Addr: addr, Retry: effects.RetryPolicy{MaxAttempts: 3}})

	out, err := s.Fire(context.Background(), mailCall)
	require.Equal(t, 3, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "connect")
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

// hangingMail is a relay that reads the message and then does not answer
// until the test ends.
func hangingMail(t *testing.T) *mailBundle {
	t.Helper()
	release := make(chan struct{})
	b := setupMail(t, withReply(func(_ int, step string) error {
		if step == "DATA" {
			<-release
		}
		return nil
	}))
	t.Cleanup(func() { close(release) }) // runs before the relay's shutdown
	return b
}

func TestSMTPTimeoutAfterTheMessage(t *testing.T) {
	t.Parallel()
	b := hangingMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr, Timeout: 100 * time.Millisecond, Retry: effects.RetryPolicy{MaxAttempts: 2}})

	out, err := s.Fire(context.Background(), mailCall)
	require.Equal(t, 2, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "the end of the message: no reply within 100ms (the relay may have accepted the message")
	msgs := b.delivered()
	require.Len(t, msgs, 2)
	require.Equal(t, readMail(t, msgs[0]).Header.Get("Message-ID"), readMail(t, msgs[1]).Header.Get("Message-ID"))
}

func TestSMTPContextCancelAbortsTheTransaction(t *testing.T) {
	t.Parallel()
	b := hangingMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr, Timeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.data // the relay has the message and does not answer
		cancel()
	}()

	start := time.Now()
	out, err := s.Fire(ctx, mailCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, out.Invocations)
	require.Less(t, time.Since(start), 10*time.Second)
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

func TestSMTPContextCancelStopsRetrying(t *testing.T) {
	t.Parallel()
	b := setupMail(t, withReply(func(_ int, step string) error {
		if step == "DATA" {
			return smtpErr(451, "Later")
		}
		return nil
	}))
	s := newSMTP(t, smtp.Config{Addr: b.addr, Retry: effects.RetryPolicy{MaxAttempts: 10, InitialInterval: time.Hour, MaxInterval: time.Hour}})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.data
		cancel()
	}()
	out, err := s.Fire(ctx, mailCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, out.Invocations)

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	out, err = s.Fire(ctx, mailCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 0, out.Invocations)
}

func TestSMTPArgsProblemsArePermanent(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr})
	many := make([]string, smtp.MaxRecipients+1)
	for i := range many {
		many[i] = fmt.Sprintf("u%d@example.com", i)
	}
	manyJSON, err := json.Marshal(map[string]any{"to": many})
	require.NoError(t, err)
	for _, tc := range []struct {
		name, args, want string
	}{
		{"NoTo", `{"subject":"hi","text":"x"}`, `smtp: args.to is missing: give the recipient`},
		{"NullTo", `{"to":null}`, `args.to is missing`},
		{"EmptyList", `{"to":[]}`, `args.to is missing`},
		{"ToNumber", `{"to":42}`, `args.to is a number, want an address or a list of addresses`},
		{"BadAddress", `{"to":"not an address"}`, `args.to: "not an address" is not an email address`},
		{"BadListItem", `{"to":["a@example.com","@@"]}`, `args.to[1]: "@@" is not an email address`},
		{"BadCc", `{"to":"a@example.com","cc":{"x":1}}`, `args.cc is an object`},
		{"NonASCIIAddress", `{"to":"jürgen@example.com"}`, `is not an ASCII address`},
		{"SubjectNotString", `{"to":"a@example.com","subject":["x"]}`, `args.subject is a list, want a string`},
		{"TextNotString", `{"to":"a@example.com","text":true}`, `args.text is a boolean, want a string`},
		{"TooManyRecipients", string(manyJSON), `101 recipients, more than the 100`},
		{"NotAnObject", `[1]`, `args are not a JSON object`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := s.Fire(context.Background(), effects.Call{Key: "k", Tool: "send_email", Args: json.RawMessage(tc.args)})
			pe, ok := effects.IsPermanent(err)
			require.True(t, ok, "err: %v", err)
			require.Equal(t, "effect_failed", pe.Code)
			require.Contains(t, pe.Message, tc.want)
			require.Equal(t, 0, out.Invocations, "nothing was attempted")
		})
	}
	require.Equal(t, int32(0), b.txns.Load())
}

func TestSMTPCommaSeparatedTo(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr, Helo: "worker1.example.com"})
	_, err := s.Fire(context.Background(), effects.Call{Key: "k", Tool: "t", Args: json.RawMessage(`{"to":"a@example.com, B <b@example.com>, A@example.com"}`)})
	require.NoError(t, err)
	require.Equal(t, []string{"a@example.com", "b@example.com"}, b.delivered()[0].rcpts, "one RCPT per distinct address")
}

func TestSMTPMaxDuration(t *testing.T) {
	t.Parallel()
	s, err := smtp.New(smtp.Config{Addr: "relay:25", From: "a@example.com"})
	require.NoError(t, err)
	require.Equal(t, 4*smtp.DefaultTimeout+3*effects.DefaultMaxInterval, s.MaxDuration())
	sum := sha256.Sum256([]byte("k"))
	require.Equal(t, "<t."+hex.EncodeToString(sum[:16])+"@example.com>", s.MessageID("t", "k"))
	require.Equal(t, "<"+hex.EncodeToString(sum[:16])+"@example.com>", s.MessageID("", "k"), "no tool, no prefix")
}

func TestNewSMTPRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  smtp.Config
		want string
	}{
		{"NoAddr", smtp.Config{From: "a@x.org"}, "addr: is missing"},
		{"AddrNoPort", smtp.Config{Addr: "relay", From: "a@x.org"}, "is not host:port"},
		{"AddrBadPort", smtp.Config{Addr: "relay:smtp", From: "a@x.org"}, "has no valid port"},
		{"NoFrom", smtp.Config{Addr: "relay:25"}, "from: is missing"},
		{"BadFrom", smtp.Config{Addr: "relay:25", From: "nobody"}, "is not an email address"},
		{"StartTLS", smtp.Config{Addr: "relay:25", From: "a@x.org", StartTLS: "always"}, "is not one of required, opportunistic, off"},
		{"CAFileWithOff", smtp.Config{Addr: "relay:25", From: "a@x.org", StartTLS: smtp.StartTLSOff, CAFile: "/x.pem"}, "has no use with starttls: off"},
		{"CAFileMissing", smtp.Config{Addr: "relay:25", From: "a@x.org", CAFile: "/nonexistent/ca.pem"}, "cannot be read"},
		{"NoPassword", smtp.Config{Addr: "relay:25", From: "a@x.org", Username: "u"}, "password_env: is missing"},
		{"ClearTextAuth", smtp.Config{Addr: "relay:25", From: "a@x.org", Username: "u", Password: "p", StartTLS: smtp.StartTLSOff}, "in the clear to relay"},
		{"Helo", smtp.Config{Addr: "relay:25", From: "a@x.org", Helo: "a b"}, `"a b" is not a host name`},
		{"Retry", smtp.Config{Addr: "relay:25", From: "a@x.org", Retry: effects.RetryPolicy{MaxAttempts: 101}}, "not between 1 and 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := smtp.New(tc.cfg)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), `"p"`)
		})
	}
	_, err := smtp.New(smtp.Config{Addr: "localhost:25", From: "a@x.org", Username: "u", Password: "p", StartTLS: smtp.StartTLSOff})
	require.NoError(t, err, "AUTH in the clear to localhost is allowed, as net/smtp allows it")
}

func TestSMTPConfigStringHidesThePassword(t *testing.T) {
	t.Parallel()
	cfg := smtp.Config{Addr: "relay:587", Username: "mailer", Password: "s3cret"}
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		got := fmt.Sprintf(format, cfg)
		require.NotContains(t, got, "s3cret")
		require.Contains(t, got, "mailer")
	}
}

func TestParseSMTP(t *testing.T) {
	t.Parallel()
	const env = "IDEMGATE_TEST_PARSE_SMTP_PASSWORD"
	require.NoError(t, os.Setenv(env, "pw"))
	t.Cleanup(func() { _ = os.Unsetenv(env) })
	ca := newTestCA(t)
	tool := parseTool(t, fmt.Sprintf(`tools:
  send_email:
    effect: smtp
    key_args: [to, subject]
    smtp:
      addr: smtp.internal:587
      from: "Billing <billing@example.com>"
      starttls: required
      ca_file: %s
      username: mailer
      password_env: %s
      timeout: 20s
      helo: worker1.example.com
      retry: {max_attempts: 3, initial_interval: 1s, max_interval: 10s}
`, ca.caFile, env))
	require.Equal(t, "smtp", tool.Kind)
	require.IsType(t, &smtp.Effect{}, tool.Effect)
	require.Equal(t, 3*20*time.Second+2*10*time.Second, tool.MaxDuration)

	bare := parseTool(t, "tools:\n  t:\n    effect: smtp\n    key_args: [to]\n    smtp: {addr: 'relay:25', from: a@example.com}\n")
	require.Equal(t, 4*smtp.DefaultTimeout+3*effects.DefaultMaxInterval, bare.MaxDuration)
}

func TestParseSMTPErrors(t *testing.T) {
	t.Parallel()
	const head = "tools:\n  t:\n    effect: smtp\n    key_args: [to]\n"
	for _, tc := range []struct {
		name string
		file string
		want []string
	}{
		{"Missing", head, []string{`tools.yaml:2: t.smtp: is missing (add smtp: with at least addr: and from:)`}},
		{"NoAddrNoFrom", head + "    smtp:\n      helo: h\n", []string{
			`tools.yaml:5: t.smtp.addr: is missing (write e.g. smtp.internal:587)`,
			`tools.yaml:5: t.smtp.from: is missing`,
		}},
		{"BadStartTLS", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      starttls: yes\n", []string{
			`tools.yaml:8: t.smtp.starttls: "yes" is not one of required, opportunistic, off`,
		}},
		{"InsecureSkipVerify", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      tls_insecure_skip_verify: true\n", []string{
			`tools.yaml:8: t.smtp.tls_insecure_skip_verify: unknown field`,
		}},
		{"CAFileMissing", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      ca_file: /nonexistent/ca.pem\n", []string{
			`tools.yaml:8: t.smtp.ca_file: cannot be read:`,
		}},
		{"PasswordEnvUnset", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      username: u\n      password_env: IDEMGATE_TEST_SURELY_UNSET\n", []string{
			`tools.yaml:9: t.smtp.password_env: the environment variable IDEMGATE_TEST_SURELY_UNSET is not set`,
		}},
		{"PasswordEnvBadName", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      username: u\n      password_env: hunter2!\n", []string{
			`tools.yaml:9: t.smtp.password_env: "hunter2!" is not an environment variable name`,
		}},
		{"UsernameWithoutPassword", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      username: u\n", []string{
			`tools.yaml:5: t.smtp.password_env: is missing`,
		}},
		{"ClearTextAuth", head + "    smtp:\n      addr: relay.example.com:25\n      from: a@example.com\n      starttls: off\n      username: u\n      password_env: PATH\n", []string{
			`tools.yaml:9: t.smtp.username: the password would cross the network in the clear to relay.example.com`,
		}},
		{"ZeroTimeout", head + "    smtp:\n      addr: relay:25\n      from: a@example.com\n      timeout: 0s\n      retry: {max_attempts: 0}\n", []string{
			`tools.yaml:8: t.smtp.timeout: must be positive`,
			`tools.yaml:9: t.smtp.retry.max_attempts: must be positive`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := toolsfile.Parse([]byte(tc.file))
			require.Nil(t, r)
			require.ErrorIs(t, err, toolsfile.ErrConfig)
			lines := strings.Split(err.Error(), "\n")
			require.Len(t, lines, len(tc.want), "errors: %v", err)
			for i, want := range tc.want {
				require.True(t, strings.HasPrefix(lines[i], want), "error %d:\n got  %s\n want %s...", i, lines[i], want)
			}
		})
	}
}

// firingCall is a third claim of an operation, fired by worker w2.3.
var firingCall = effects.Call{
	Key: "send_email.77aa", Tool: "send_email", Attempt: 3, Holder: "w2.3",
	Args: json.RawMessage(`{"subject":"hi","to":"ann@example.com"}`),
}

func TestSMTPSendsHolderAndAttempt(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, smtp.Config{Addr: b.addr})

	_, err := s.Fire(context.Background(), firingCall)
	require.NoError(t, err)
	_, err = s.Fire(context.Background(), effects.Call{Key: firingCall.Key, Tool: firingCall.Tool, Args: firingCall.Args})
	require.NoError(t, err)
	msgs := b.delivered()
	require.Len(t, msgs, 2)
	m := readMail(t, msgs[0])
	require.Equal(t, "w2.3", m.Header.Get(effects.HeaderHolder))
	require.Equal(t, "3", m.Header.Get(effects.HeaderAttempt))
	bare := readMail(t, msgs[1])
	require.NotContains(t, bare.Header, effects.HeaderHolder)
	require.NotContains(t, bare.Header, effects.HeaderAttempt)
	require.Equal(t, m.Header.Get("Message-ID"), bare.Header.Get("Message-ID"), "the key alone makes the Message-ID")
}

var (
	_ effects.Effect  = (*smtp.Effect)(nil)
	_ effects.Bounded = (*smtp.Effect)(nil)
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func parse(t *testing.T, data string, opts ...toolsfile.Option) *effects.Registry {
	t.Helper()
	r, err := toolsfile.Parse([]byte(data), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}
