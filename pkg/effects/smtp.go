package effects

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// SMTP defaults and limits.
const (
	// DefaultSMTPTimeout bounds one SMTP transaction, from connecting to
	// the relay's reply to the end of the message.
	DefaultSMTPTimeout = 30 * time.Second
	// DefaultSMTPHelo is the name an smtp effect gives in EHLO.
	DefaultSMTPHelo = "localhost"
	// MaxSMTPRecipients is how many distinct recipients (to, cc and bcc
	// together) one message may have: the number RFC 5321 requires every
	// relay to accept.
	MaxSMTPRecipients = 100
)

// HeaderMailTool is the message header in which an smtp effect names the
// tool. The operation's key travels in HeaderIdempotencyKey.
const HeaderMailTool = "X-Idem-Tool"

// StartTLSPolicy says whether an smtp effect encrypts its connection to the
// relay with STARTTLS.
type StartTLSPolicy string

// STARTTLS policies.
const (
	// StartTLSOpportunistic upgrades the connection when the relay offers
	// STARTTLS and sends in the clear when it does not. When it is offered,
	// the relay's certificate must verify: a failed handshake is an error,
	// never a fallback to plain text.
	StartTLSOpportunistic StartTLSPolicy = "opportunistic"
	// StartTLSRequired refuses to send unless the connection is upgraded and
	// the relay's certificate verifies.
	StartTLSRequired StartTLSPolicy = "required"
	// StartTLSOff never upgrades the connection.
	StartTLSOff StartTLSPolicy = "off"
)

// SMTPConfig configures an smtp effect. Zero fields mean the defaults.
type SMTPConfig struct {
	// Addr is the relay's host:port, e.g. "smtp.internal:587". Required.
	Addr string
	// From is the sender, an address with an optional display name
	// ("Billing <billing@example.com>"): the From header and the envelope
	// sender. Required.
	From string
	// StartTLS is the STARTTLS policy. Default StartTLSOpportunistic.
	StartTLS StartTLSPolicy
	// CAFile is a PEM file of the certificate authorities that sign the
	// relay's certificate, for a relay with a private CA. Default: the
	// system's roots. The certificate must name the host of Addr.
	CAFile string
	// Username, when set, authenticates with AUTH PLAIN. The credentials
	// are sent only over TLS, or to a relay on localhost.
	Username string
	// Password is Username's password. It appears in no error and no
	// result. (A tools file names an environment variable holding it.)
	Password string
	// Timeout bounds one SMTP transaction: connecting, the dialogue and the
	// relay's reply to the message. Default DefaultSMTPTimeout.
	Timeout time.Duration
	// Retry is the retry policy, as for a webhook.
	Retry RetryPolicy
	// Helo is the name given in EHLO. Default DefaultSMTPHelo.
	Helo string
}

// String describes the config with the password redacted, so that printing
// it never shows the secret.
func (c SMTPConfig) String() string {
	pw := ""
	if c.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{Addr:%s From:%s StartTLS:%s CAFile:%s Username:%s Password:%s Timeout:%s Retry:%+v Helo:%s}",
		c.Addr, c.From, c.StartTLS, c.CAFile, c.Username, pw, c.Timeout, c.Retry, c.Helo)
}

// GoString is String for %#v.
func (c SMTPConfig) GoString() string { return "effects.SMTPConfig" + c.String() }

// SMTP is the effect that sends an email through a relay (kind smtp).
//
// The intent's args are the message:
//
//	to       an address or a list of them; a string may hold several,
//	         comma-separated. Required.
//	cc       the same, optional: recipients named in the Cc header.
//	bcc      the same, optional: recipients not named in any header.
//	subject  a string, optional.
//	text     the plain-text body, optional.
//	html     an HTML body, optional: with text, the message is
//	         multipart/alternative; alone, it is text/html.
//
// Addresses may carry a display name ("Ann <ann@example.com>") and must be
// ASCII. Other args are ignored (they may still enter the key). An args
// problem (to missing, a bad address, a field of the wrong type, more than
// MaxSMTPRecipients recipients) is a *PermanentError: nothing is sent.
//
// The message carries Date, From, To, Cc, Subject (RFC 2047-encoded when
// not ASCII), MIME-Version, Content-Type (charset utf-8, quoted-printable)
// and three headers that identify the operation: Message-ID, derived from
// the key alone (see MessageID), so every retry and every re-firing of the
// operation sends the same Message-ID and a mail system that keeps them can
// drop the repeat; Idempotency-Key, the key; and X-Idem-Tool, the tool.
// Idem-Holder and Idem-Attempt (each when set) name the claim that fires.
// Everything but Date is the same on every attempt of one Fire.
//
// Each attempt is one SMTP transaction on a new connection: EHLO, STARTTLS
// per the policy, AUTH PLAIN when a username is set, MAIL FROM, one RCPT TO
// per distinct recipient, DATA. The message goes to every recipient or to
// none: a rejected recipient aborts the transaction. The relay's replies
// decide the outcome:
//
//   - 2xx to the message: success. The result is {"message_id": "<...>",
//     "accepted": [recipients], "smtp": "<the relay's final reply>"}.
//   - 4xx at any step, a connection error, a TLS failure, a relay that does
//     not offer STARTTLS under StartTLSRequired, or a timeout: retried with
//     backoff as the webhook does, with the same Message-ID. When the
//     attempts run out the error is transient and wraps ErrExhausted.
//   - 5xx at any step (a rejected recipient, failed authentication, a
//     refused message): a *PermanentError with code effect_failed, quoting
//     the step and the relay's code and text.
//
// A timeout while waiting for the relay's reply to the message is
// ambiguous: the relay may have accepted it. The retry sends it again with
// the same Message-ID, which only a system that deduplicates by Message-ID
// absorbs; keep Timeout above what the relay may take.
//
// An SMTP holds no connection between firings and needs no Close.
type SMTP struct {
	addr      string
	host      string
	from      string // the envelope sender
	fromHdr   string // the From header's value
	domain    string // the right side of Message-IDs
	starttls  StartTLSPolicy
	tlsConfig *tls.Config
	auth      smtp.Auth
	timeout   time.Duration
	retry     RetryPolicy
	helo      string
}

// NewSMTP returns an smtp effect for cfg, or an error naming every invalid
// field. It reads CAFile.
func NewSMTP(cfg SMTPConfig) (*SMTP, error) {
	s, problems := cfg.withDefaults().build()
	if len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = fmt.Errorf("effects: smtp %s: %s (%s)", p.field, p.problem, p.hint)
		}
		return nil, errors.Join(errs...)
	}
	return s, nil
}

func (c SMTPConfig) withDefaults() SMTPConfig {
	if c.StartTLS == "" {
		c.StartTLS = StartTLSOpportunistic
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultSMTPTimeout
	}
	if c.Helo == "" {
		c.Helo = DefaultSMTPHelo
	}
	c.Retry = retryDefaults(c.Retry)
	return c
}

var (
	heloPattern   = regexp.MustCompile(`^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])$`)
	domainPattern = regexp.MustCompile(`^[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*$`)
)

// build validates a config with its defaults applied and builds the effect;
// the problems name fields as in the tools file.
func (c SMTPConfig) build() (*SMTP, []problem) {
	var ps []problem
	add := func(field, msg, hint string) { ps = append(ps, problem{field, msg, hint}) }
	s := &SMTP{addr: c.Addr, starttls: c.StartTLS, timeout: c.Timeout, retry: c.Retry, helo: c.Helo}

	const addrHint = "write e.g. smtp.internal:587"
	if c.Addr == "" {
		add("addr", "is missing", addrHint)
	} else if host, port, err := net.SplitHostPort(c.Addr); err != nil {
		add("addr", fmt.Sprintf("%q is not host:port", c.Addr), addrHint)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		add("addr", fmt.Sprintf("%q has no valid port", c.Addr), addrHint)
	} else if host == "" {
		add("addr", fmt.Sprintf("%q has no host", c.Addr), addrHint)
	} else {
		s.host = host
	}

	const fromHint = "write e.g. from: Billing <billing@example.com>"
	if c.From == "" {
		add("from", "is missing", fromHint)
	} else if a, err := mail.ParseAddress(c.From); err != nil {
		add("from", fmt.Sprintf("%q is not an email address", c.From), fromHint)
	} else if !isASCII(a.Address) {
		add("from", fmt.Sprintf("%q is not an ASCII address", a.Address), "international addresses are not supported")
	} else {
		s.from, s.fromHdr = a.Address, a.String()
		s.domain = a.Address[strings.LastIndexByte(a.Address, '@')+1:]
		if !domainPattern.MatchString(s.domain) {
			s.domain = "idemgate"
		}
	}

	switch c.StartTLS {
	case StartTLSOpportunistic, StartTLSRequired, StartTLSOff:
	default:
		add("starttls", fmt.Sprintf("%q is not one of required, opportunistic, off", c.StartTLS), "write e.g. starttls: required")
	}

	if c.StartTLS != StartTLSOff {
		s.tlsConfig = &tls.Config{ServerName: s.host, MinVersion: tls.VersionTLS12}
	}
	if c.CAFile != "" {
		switch pool, err := loadCAFile(c.CAFile); {
		case c.StartTLS == StartTLSOff:
			add("ca_file", "has no use with starttls: off", "remove ca_file, or set starttls: required")
		case err != nil:
			add("ca_file", err.Error(), "give a PEM file of the CA certificates that sign the relay's certificate")
		case s.tlsConfig != nil:
			s.tlsConfig.RootCAs = pool
		}
	}

	switch {
	case c.Username == "" && c.Password != "":
		add("username", "is missing, but a password is set", "add username:, or remove password_env")
	case c.Username != "" && c.Password == "":
		add("password_env", "is missing, or names an empty variable", "add password_env: naming the environment variable that holds the password")
	case strings.ContainsAny(c.Username, "\x00\r\n"):
		add("username", "holds a NUL or a line break", "write the username on one line")
	case strings.ContainsRune(c.Password, 0):
		add("password_env", "the password holds a NUL", "AUTH PLAIN cannot carry it")
	case c.Username != "" && c.StartTLS == StartTLSOff && !isLocalhost(s.host):
		add("username", fmt.Sprintf("the password would cross the network in the clear to %s", s.host), "set starttls: required (AUTH is sent only over TLS, or to localhost)")
	case c.Username != "":
		s.auth = smtp.PlainAuth("", c.Username, c.Password, s.host)
	}

	if c.Timeout < 0 {
		add("timeout", "is negative", "write e.g. 30s")
	}
	if !heloPattern.MatchString(c.Helo) {
		add("helo", fmt.Sprintf("%q is not a host name", c.Helo), "write e.g. helo: worker1.example.com")
	}
	ps = append(ps, retryProblems(c.Retry)...)
	if len(ps) > 0 {
		return nil, ps
	}
	return s, nil
}

// loadCAFile reads a PEM file of CA certificates.
func loadCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// isLocalhost is net/smtp's rule for where AUTH PLAIN may go without TLS.
func isLocalhost(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// MaxDuration is the longest one Fire may take: every transaction timing
// out, with the longest wait between them.
func (s *SMTP) MaxDuration() time.Duration {
	n := time.Duration(s.retry.MaxAttempts)
	return n*s.timeout + (n-1)*s.retry.MaxInterval
}

// MessageID returns the Message-ID header value of every message sent for
// the operation with this tool and key: "<tool.H@domain>", where H is the
// first 32 hex digits of the SHA-256 of the key and domain is the From
// address's domain (without a valid tool, "<H@domain>"). Nothing else
// enters it, so it is the same on every retry, in every worker and after a
// restart.
func (s *SMTP) MessageID(tool, key string) string {
	sum := sha256.Sum256([]byte(key))
	id := hex.EncodeToString(sum[:16])
	if toolNamePattern.MatchString(tool) {
		id = tool + "." + id
	}
	return "<" + id + "@" + s.domain + ">"
}

// Fire sends the email the call's args describe, retrying as the policy
// says. See SMTP for the message, the args and how replies are classified.
// Outcome.Invocations is the number of SMTP transactions attempted
// (connections included that failed before the first command).
func (s *SMTP) Fire(ctx context.Context, call Call) (Outcome, error) {
	m, err := s.compose(call)
	if err != nil {
		return Outcome{}, err
	}
	return retryLoop(ctx, s.retry, "smtp "+s.addr, "transaction", func(ctx context.Context) (json.RawMessage, error) {
		return s.send(ctx, m)
	})
}

// message is an email ready to send.
type message struct {
	id    string
	rcpts []string // envelope recipients, distinct
	body  []byte   // every header but Date, the blank line and the body
}

// mailResult is an smtp effect's result.
type mailResult struct {
	MessageID string   `json:"message_id"`
	Accepted  []string `json:"accepted"`
	SMTP      string   `json:"smtp"`
}

// send runs one SMTP transaction.
func (s *SMTP) send(ctx context.Context, m *message) (json.RawMessage, error) {
	attemptCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	stage := "connect"
	fail := func(err error) error { return s.classify(ctx, attemptCtx, stage, err) }

	conn, err := (&net.Dialer{}).DialContext(attemptCtx, "tcp", s.addr)
	if err != nil {
		return nil, fail(err)
	}
	defer conn.Close()
	if deadline, ok := attemptCtx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	// Cancellation (or the timeout) interrupts whatever read or write is
	// under way.
	stop := context.AfterFunc(attemptCtx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	stage = "greeting"
	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		return nil, fail(err)
	}
	polite := func() { _, _, _ = cmd(c.Text, 221, "QUIT") }

	stage = "EHLO"
	if err := c.Hello(s.helo); err != nil {
		return nil, fail(err)
	}
	if s.starttls != StartTLSOff {
		stage = "STARTTLS"
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(s.tlsConfig); err != nil {
				if isReply(err) {
					polite()
				}
				return nil, fail(err)
			}
		} else if s.starttls == StartTLSRequired {
			polite()
			return nil, fmt.Errorf("smtp %s: the relay does not offer STARTTLS, and starttls is required", s.addr)
		}
	}
	if s.auth != nil {
		stage = "AUTH"
		if ok, _ := c.Extension("AUTH"); !ok {
			polite()
			return nil, fmt.Errorf("smtp %s: a username is set, but the relay does not offer AUTH", s.addr)
		}
		if _, isTLS := c.TLSConnectionState(); !isTLS && !isLocalhost(s.host) {
			polite()
			return nil, fmt.Errorf("smtp %s: the relay does not offer STARTTLS, and the password is sent only over TLS", s.addr)
		}
		// On failure, net/smtp sends QUIT itself.
		if err := c.Auth(s.auth); err != nil {
			return nil, fail(err)
		}
	}

	text := c.Text // StartTLS replaced it
	stage = "MAIL FROM"
	if _, _, err := cmd(text, 2, "MAIL FROM:<%s>", s.from); err != nil {
		if isReply(err) {
			polite()
		}
		return nil, fail(err)
	}
	for _, rcpt := range m.rcpts {
		stage = "RCPT TO:<" + rcpt + ">"
		if _, _, err := cmd(text, 2, "RCPT TO:<%s>", rcpt); err != nil {
			if isReply(err) {
				polite()
			}
			return nil, fail(err)
		}
	}
	stage = "DATA"
	if _, _, err := cmd(text, 354, "DATA"); err != nil {
		if isReply(err) {
			polite()
		}
		return nil, fail(err)
	}
	stage = "the message"
	w := text.DotWriter()
	_, err = fmt.Fprintf(w, "Date: %s\r\n", time.Now().Format(time.RFC1123Z))
	if err == nil {
		_, err = w.Write(m.body)
	}
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		return nil, fail(err)
	}
	stage = stageFinalReply
	code, reply, err := text.ReadResponse(2)
	if err != nil {
		if isReply(err) {
			polite()
		}
		return nil, fail(err)
	}
	polite() // the message is accepted: a failed QUIT changes nothing

	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(mailResult{MessageID: m.id, Accepted: m.rcpts, SMTP: strconv.Itoa(code) + " " + oneLine(reply)})
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// stageFinalReply is the step after the message was sent, when a lost reply
// leaves it unknown whether the relay accepted it.
const stageFinalReply = "the end of the message"

// cmd sends one command and reads its reply.
func cmd(t *textproto.Conn, expect int, format string, args ...any) (int, string, error) {
	id, err := t.Cmd(format, args...)
	if err != nil {
		return 0, "", err
	}
	t.StartResponse(id)
	defer t.EndResponse(id)
	return t.ReadResponse(expect)
}

// isReply reports whether err is the relay's (unexpected) reply, after
// which the connection is still usable.
func isReply(err error) bool {
	var te *textproto.Error
	return errors.As(err, &te)
}

// classify turns a failed step into the effect's error: the relay's 5xx
// replies are permanent, everything else is transient.
func (s *SMTP) classify(ctx, attemptCtx context.Context, stage string, err error) error {
	var te *textproto.Error
	switch {
	case errors.As(err, &te):
		msg := fmt.Sprintf("smtp %s: %s answered %d %s", s.addr, stage, te.Code, oneLine(te.Msg))
		if te.Code >= 500 && te.Code < 600 {
			return Permanent(intent.CodeEffectFailed, msg)
		}
		return errors.New(msg)
	case ctx.Err() != nil:
		return fmt.Errorf("smtp %s: %s: %w", s.addr, stage, ctx.Err())
	case errors.Is(attemptCtx.Err(), context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		msg := fmt.Sprintf("smtp %s: %s: no reply within %s", s.addr, stage, formatDuration(s.timeout))
		if stage == "connect" {
			msg = fmt.Sprintf("smtp %s: no connection within %s", s.addr, formatDuration(s.timeout))
		}
		if stage == stageFinalReply {
			msg += " (the relay may have accepted the message; a retry sends it again with the same Message-ID)"
		}
		return errors.New(msg)
	}
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case errors.As(err, &unknownCA):
		return fmt.Errorf("smtp %s: %s: %w (set ca_file to the CA that signs the relay's certificate)", s.addr, stage, err)
	case errors.As(err, &hostErr):
		return fmt.Errorf("smtp %s: %s: %w (addr must name a host the relay's certificate is for)", s.addr, stage, err)
	}
	return fmt.Errorf("smtp %s: %s: %w", s.addr, stage, err)
}

// oneLine joins a multi-line reply's lines.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// compose builds the message for call; an args problem is permanent.
func (s *SMTP) compose(call Call) (*message, error) {
	a, err := parseMailArgs(call.Args)
	if err != nil {
		return nil, err
	}
	m := &message{id: s.MessageID(call.Tool, call.Key)}
	seen := map[string]bool{}
	for _, list := range [][]*mail.Address{a.to, a.cc, a.bcc} {
		for _, addr := range list {
			if k := strings.ToLower(addr.Address); !seen[k] {
				seen[k] = true
				m.rcpts = append(m.rcpts, addr.Address)
			}
		}
	}
	if len(m.rcpts) > MaxSMTPRecipients {
		return nil, Permanentf(intent.CodeEffectFailed, "smtp: %d recipients, more than the %d one message may have", len(m.rcpts), MaxSMTPRecipients)
	}

	var b bytes.Buffer
	header := func(name, value string) { b.WriteString(name + ": " + value + "\r\n") }
	header("From", s.fromHdr)
	header("To", foldList("To", a.to))
	if len(a.cc) > 0 {
		header("Cc", foldList("Cc", a.cc))
	}
	if a.subject != "" {
		header("Subject", fold("Subject", encodeWords(a.subject)))
	}
	header("Message-ID", m.id)
	header(HeaderIdempotencyKey, fold(HeaderIdempotencyKey, encodeWords(call.Key)))
	if call.Tool != "" {
		header(HeaderMailTool, fold(HeaderMailTool, encodeWords(call.Tool)))
	}
	holder, attempt := firingHeaders(call)
	if holder != "" {
		header(HeaderHolder, fold(HeaderHolder, encodeWords(holder)))
	}
	if attempt != "" {
		header(HeaderAttempt, attempt)
	}
	header("MIME-Version", "1.0")

	sum := sha256.Sum256([]byte(call.Key))
	switch {
	case a.hasHTML && a.text != "":
		// "=" never starts a line of quoted-printable text, so no body
		// can contain the boundary; deriving it from the key keeps the
		// message the same on every attempt.
		boundary := "=_idem_" + hex.EncodeToString(sum[:12])
		header("Content-Type", mime.FormatMediaType("multipart/alternative", map[string]string{"boundary": boundary}))
		b.WriteString("\r\n")
		mw := multipart.NewWriter(&b)
		_ = mw.SetBoundary(boundary)
		for _, part := range []struct{ typ, body string }{{"text/plain", a.text}, {"text/html", a.html}} {
			pw, _ := mw.CreatePart(textproto.MIMEHeader{
				"Content-Type":              {part.typ + "; charset=utf-8"},
				"Content-Transfer-Encoding": {"quoted-printable"},
			})
			writeQP(pw, part.body)
		}
		_ = mw.Close()
	case a.hasHTML:
		header("Content-Type", "text/html; charset=utf-8")
		header("Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		writeQP(&b, a.html)
	default:
		header("Content-Type", "text/plain; charset=utf-8")
		header("Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		writeQP(&b, a.text)
	}
	for line := range bytes.SplitSeq(b.Bytes(), []byte("\r\n")) {
		if len(line) > 998 {
			return nil, Permanent(intent.CodeEffectFailed, "smtp: a header line would exceed 998 characters: shorten the subject or the display names")
		}
	}
	m.body = b.Bytes()
	return m, nil
}

func writeQP(w interface{ Write([]byte) (int, error) }, s string) {
	qp := quotedprintable.NewWriter(w)
	_, _ = qp.Write([]byte(s))
	_ = qp.Close()
}

// encodeWords makes a header value safe: control characters become spaces,
// and a value that is not ASCII is RFC 2047-encoded.
func encodeWords(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return mime.QEncoding.Encode("utf-8", s)
}

// fold folds a header value at its spaces so that lines stay within 78
// characters where the words allow. Encoded words hold no spaces, so an
// encoded value folds between them.
func fold(name, value string) string {
	var b strings.Builder
	lineLen := len(name) + 2
	for i, word := range strings.Split(value, " ") {
		if i > 0 {
			if lineLen+1+len(word) > 78 {
				b.WriteString("\r\n")
				lineLen = 0
			}
			b.WriteByte(' ')
			lineLen++
		}
		b.WriteString(word)
		lineLen += len(word)
	}
	return b.String()
}

// foldList writes addresses comma-separated, folding between them.
func foldList(name string, addrs []*mail.Address) string {
	var b strings.Builder
	lineLen := len(name) + 2
	for i, a := range addrs {
		s := a.String()
		if i > 0 {
			b.WriteByte(',')
			if lineLen+2+len(s) > 78 {
				b.WriteString("\r\n")
				lineLen = 0
			}
			b.WriteByte(' ')
			lineLen += 2
		}
		b.WriteString(s)
		lineLen += len(s)
	}
	return b.String()
}

// mailArgs are the message fields of an smtp intent's args.
type mailArgs struct {
	to, cc, bcc         []*mail.Address
	subject, text, html string
	hasHTML             bool
}

// parseMailArgs reads the args contract (see SMTP); every problem is a
// *PermanentError.
func parseMailArgs(raw json.RawMessage) (*mailArgs, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, Permanent(intent.CodeEffectFailed, "smtp: the args are not a JSON object")
	}
	a := &mailArgs{}
	var err error
	if a.to, err = addressArg(fields, "to"); err != nil {
		return nil, err
	}
	if len(a.to) == 0 {
		return nil, Permanent(intent.CodeEffectFailed, `smtp: args.to is missing: give the recipient, e.g. "to": "ann@example.com", or a list of them`)
	}
	if a.cc, err = addressArg(fields, "cc"); err != nil {
		return nil, err
	}
	if a.bcc, err = addressArg(fields, "bcc"); err != nil {
		return nil, err
	}
	if a.subject, _, err = stringArg(fields, "subject"); err != nil {
		return nil, err
	}
	if a.text, _, err = stringArg(fields, "text"); err != nil {
		return nil, err
	}
	if a.html, a.hasHTML, err = stringArg(fields, "html"); err != nil {
		return nil, err
	}
	return a, nil
}

// stringArg reads an optional string arg; null counts as absent.
func stringArg(fields map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, Permanentf(intent.CodeEffectFailed, "smtp: args.%s is %s, want a string", name, jsonKind(raw))
	}
	return s, true, nil
}

// addressArg reads an optional address arg: a string (one address or a
// comma-separated list) or a list of strings; null counts as absent.
func addressArg(fields map[string]json.RawMessage, name string) ([]*mail.Address, error) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var items []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		items = []string{one}
	} else if err := json.Unmarshal(raw, &items); err != nil {
		return nil, Permanentf(intent.CodeEffectFailed, "smtp: args.%s is %s, want an address or a list of addresses", name, jsonKind(raw))
	}
	var out []*mail.Address
	for i, it := range items {
		where := "args." + name
		if len(items) > 1 || raw[0] == '[' {
			where += "[" + strconv.Itoa(i) + "]"
		}
		list, err := mail.ParseAddressList(it)
		if err != nil {
			return nil, Permanentf(intent.CodeEffectFailed, "smtp: %s: %q is not an email address (%v)", where, it, err)
		}
		for _, a := range list {
			if !isASCII(a.Address) {
				return nil, Permanentf(intent.CodeEffectFailed, "smtp: %s: %q is not an ASCII address (international addresses are not supported)", where, a.Address)
			}
		}
		out = append(out, list...)
	}
	return out, nil
}

// jsonKind names a JSON value's type for messages.
func jsonKind(raw json.RawMessage) string {
	switch t := bytes.TrimSpace(raw); {
	case len(t) == 0:
		return "empty"
	case t[0] == '{':
		return "an object"
	case t[0] == '[':
		return "a list"
	case t[0] == '"':
		return "a string"
	case t[0] == 't' || t[0] == 'f':
		return "a boolean"
	case t[0] == 'n':
		return "null"
	}
	return "a number"
}

// KindSMTP is the effect kind of emails sent through an SMTP relay in a
// tools file.
const KindSMTP = "smtp"

func init() { registerBuiltin(KindSMTP, smtpFactory) }

// smtpFactory builds an smtp effect from a tool's "smtp:" settings.
func smtpFactory(s *Section) (Effect, error) {
	cfg := SMTPConfig{
		Addr:     s.String("addr", ""),
		From:     s.String("from", ""),
		StartTLS: StartTLSPolicy(s.String("starttls", string(StartTLSOpportunistic))),
		CAFile:   s.String("ca_file", ""),
		Username: s.String("username", ""),
		Timeout:  positiveDuration(s, "timeout", DefaultSMTPTimeout),
		Retry:    readRetry(s),
		Helo:     s.String("helo", DefaultSMTPHelo),
	}
	passwordOK := true
	if s.Has("password_env") {
		name := s.String("password_env", "")
		switch pw, set := os.LookupEnv(name); {
		case !envNamePattern.MatchString(name):
			s.Invalid("password_env", fmt.Sprintf("%q is not an environment variable name", name), "write e.g. password_env: SMTP_PASSWORD")
			passwordOK = false
		case !set || pw == "":
			s.Invalid("password_env", fmt.Sprintf("the environment variable %s is not set", name), "set it in the worker's environment; the password is never written in this file")
			passwordOK = false
		case cfg.Username == "":
			s.Invalid("password_env", "is set, but username is missing", "add username:, or remove password_env")
		default:
			cfg.Password = pw
		}
	} else if cfg.Username != "" {
		s.Invalid("password_env", "is missing", "add password_env: naming the environment variable that holds the password")
		passwordOK = false
	}
	if !s.Present() {
		s.Invalid("", "is missing", "add smtp: with at least addr: and from:")
		return nil, nil
	}
	if !passwordOK {
		cfg.Username = "" // reported above; build must not report it again
	}
	eff, problems := cfg.withDefaults().build()
	for _, p := range problems {
		s.Invalid(p.field, p.problem, p.hint)
	}
	if len(problems) > 0 {
		return nil, nil
	}
	return eff, nil
}

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
