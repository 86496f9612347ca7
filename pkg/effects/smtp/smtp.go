// Package smtp is the smtp effect kind: it sends the email an intent's args
// describe through a relay, with a Message-ID derived from the operation's
// key alone, so that every firing of one operation sends the same message
// (see Effect).
package smtp

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"net/smtp"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// SMTP defaults and limits.
const (
	// DefaultTimeout bounds one SMTP transaction, from connecting to
	// the relay's reply to the end of the message.
	DefaultTimeout = 30 * time.Second
	// DefaultHelo is the name an smtp effect gives in EHLO.
	DefaultHelo = "localhost"
	// MaxRecipients is how many distinct recipients (to, cc and bcc
	// together) one message may have: the number RFC 5321 requires every
	// relay to accept.
	MaxRecipients = 100
)

// HeaderMailTool is the message header in which an smtp effect names the
// tool. The operation's key travels in HeaderIdempotencyKey.
const HeaderMailTool = "X-Idem-Tool"

// Effect is the effect that sends an email through a relay (kind smtp).
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
// ASCII, with a dot-atom local part and a host name or [IPv4] literal (RFC
// 5321 4.1.2): they are written as they are in MAIL FROM and RCPT TO, so a
// quoted local part, whose spaces and '>' would end the path there, is
// refused. Other args are ignored (they may still enter the key). An args
// problem (to missing, a bad address, a field of the wrong type, more than
// MaxRecipients recipients) is a *PermanentError: nothing is sent.
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
// An Effect holds no connection between firings and needs no Close.
type Effect struct {
	addr      string
	host      string
	from      string // the envelope sender
	fromHdr   string // the From header's value
	domain    string // the right side of Message-IDs
	starttls  StartTLSPolicy
	tlsConfig *tls.Config
	auth      smtp.Auth
	timeout   time.Duration
	retry     effects.RetryPolicy
	helo      string
}

// MaxDuration is the longest one Fire may take: every transaction timing
// out, with the longest wait between them.
func (s *Effect) MaxDuration() time.Duration {
	n := time.Duration(s.retry.MaxAttempts)
	return n*s.timeout + (n-1)*s.retry.MaxInterval
}

// MessageID returns the Message-ID header value of every message sent for
// the operation with this tool and key: "<tool.H@domain>", where H is the
// first 32 hex digits of the SHA-256 of the key and domain is the From
// address's domain (without a valid tool, "<H@domain>"). Nothing else
// enters it, so it is the same on every retry, in every worker and after a
// restart.
func (s *Effect) MessageID(tool, key string) string {
	sum := sha256.Sum256([]byte(key))
	id := hex.EncodeToString(sum[:16])
	if intent.ValidTool(tool) {
		id = tool + "." + id
	}
	return "<" + id + "@" + s.domain + ">"
}

// Fire sends the email the call's args describe, retrying as the policy
// says. See Effect for the message, the args and how replies are classified.
// Outcome.Invocations is the number of SMTP transactions attempted
// (connections included that failed before the first command).
func (s *Effect) Fire(ctx context.Context, call effects.Call) (effects.Outcome, error) {
	m, err := s.compose(call)
	if err != nil {
		return effects.Outcome{}, err
	}
	return effects.Retry(ctx, s.retry, "smtp "+s.addr, "transaction", func(ctx context.Context) (json.RawMessage, error) {
		return s.send(ctx, m)
	})
}
