package smtp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"strings"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// message is an email ready to send.
type message struct {
	id    string
	rcpts []string // envelope recipients, distinct
	body  []byte   // every header but Date, the blank line and the body
}

// compose builds the message for call; an args problem is permanent.
func (s *Effect) compose(call effects.Call) (*message, error) {
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
	if len(m.rcpts) > MaxRecipients {
		return nil, effects.Permanentf(intent.CodeEffectFailed, "smtp: %d recipients, more than the %d one message may have", len(m.rcpts), MaxRecipients)
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
	header(effects.HeaderIdempotencyKey, fold(effects.HeaderIdempotencyKey, encodeWords(call.Key)))
	if call.Tool != "" {
		header(HeaderMailTool, fold(HeaderMailTool, encodeWords(call.Tool)))
	}
	holder, attempt := call.FiringHeaders()
	if holder != "" {
		header(effects.HeaderHolder, fold(effects.HeaderHolder, encodeWords(holder)))
	}
	if attempt != "" {
		header(effects.HeaderAttempt, attempt)
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
			return nil, effects.Permanent(intent.CodeEffectFailed, "smtp: a header line would exceed 998 characters: shorten the subject or the display names")
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
