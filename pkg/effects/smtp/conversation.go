package smtp

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/smtp"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/intent"
)

// mailResult is an smtp effect's result.
type mailResult struct {
	MessageID string   `json:"message_id"`
	Accepted  []string `json:"accepted"`
	SMTP      string   `json:"smtp"`
}

// send runs one SMTP transaction.
func (s *Effect) send(ctx context.Context, m *message) (json.RawMessage, error) {
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
func (s *Effect) classify(ctx, attemptCtx context.Context, stage string, err error) error {
	var te *textproto.Error
	switch {
	case errors.As(err, &te):
		msg := fmt.Sprintf("smtp %s: %s answered %d %s", s.addr, stage, te.Code, oneLine(te.Msg))
		if te.Code >= 500 && te.Code < 600 {
			return effects.Permanent(intent.CodeEffectFailed, msg)
		}
		return errors.New(msg)
	case ctx.Err() != nil:
		return fmt.Errorf("smtp %s: %s: %w", s.addr, stage, ctx.Err())
	case errors.Is(attemptCtx.Err(), context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		msg := fmt.Sprintf("smtp %s: %s: no reply within %s", s.addr, stage, text.FormatDuration(s.timeout))
		if stage == "connect" {
			msg = fmt.Sprintf("smtp %s: no connection within %s", s.addr, text.FormatDuration(s.timeout))
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
