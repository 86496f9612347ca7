// Package reply turns what a downstream answered (an HTTP response's body,
// a NATS reply's data) into an effect's result, or into the start of it
// quoted in a message.
package reply

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// MaxResult is how much of a downstream's answer a result keeps. The result
// is recorded in the ledger and sent to every caller, both NATS messages (1
// MiB by default, all fields together), so a longer answer is cut here and
// recorded as a JSON string of its first MaxResult bytes.
const MaxResult = 256 << 10

// QuoteLimit is how much of a failed answer a message quotes; a caller
// reads QuoteLimit+1 bytes of it for Quote.
const QuoteLimit = 512

// Result turns an answer's body, read up to MaxResult+1 bytes, into a JSON
// result: the body when it is JSON (compacted), null when empty, else the
// body as a JSON string. A body cut at MaxResult is always a string.
func Result(data []byte) json.RawMessage {
	cut := len(data) > MaxResult
	if cut {
		data = data[:MaxResult]
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 && !cut {
		return json.RawMessage("null")
	}
	if !cut && json.Valid(trimmed) {
		var buf bytes.Buffer
		if json.Compact(&buf, trimmed) == nil {
			return buf.Bytes()
		}
	}
	return jsonString(string(data))
}

func jsonString(s string) json.RawMessage {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// Quote is the start of a failed answer's body, for a message.
func Quote(data []byte) string {
	s := strings.TrimSpace(string(data))
	if len(s) > QuoteLimit {
		s = s[:QuoteLimit] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
