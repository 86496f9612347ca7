package smtp

import (
	"bytes"
	"encoding/json"
	"net/mail"
	"strconv"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// mailArgs are the message fields of an smtp intent's args.
type mailArgs struct {
	to, cc, bcc         []*mail.Address
	subject, text, html string
	hasHTML             bool
}

// parseMailArgs reads the args contract (see Effect); every problem is a
// *PermanentError.
func parseMailArgs(raw json.RawMessage) (*mailArgs, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, effects.Permanent(intent.CodeEffectFailed, "smtp: the args are not a JSON object")
	}
	a := &mailArgs{}
	var err error
	if a.to, err = addressArg(fields, "to"); err != nil {
		return nil, err
	}
	if len(a.to) == 0 {
		return nil, effects.Permanent(intent.CodeEffectFailed, `smtp: args.to is missing: give the recipient, e.g. "to": "ann@example.com", or a list of them`)
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
		return "", false, effects.Permanentf(intent.CodeEffectFailed, "smtp: args.%s is %s, want a string", name, jsonKind(raw))
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
		return nil, effects.Permanentf(intent.CodeEffectFailed, "smtp: args.%s is %s, want an address or a list of addresses", name, jsonKind(raw))
	}
	var out []*mail.Address
	for i, it := range items {
		where := "args." + name
		if len(items) > 1 || raw[0] == '[' {
			where += "[" + strconv.Itoa(i) + "]"
		}
		list, err := mail.ParseAddressList(it)
		if err != nil {
			return nil, effects.Permanentf(intent.CodeEffectFailed, "smtp: %s: %q is not an email address (%v)", where, it, err)
		}
		for _, a := range list {
			if !isASCII(a.Address) {
				return nil, effects.Permanentf(intent.CodeEffectFailed, "smtp: %s: %q is not an ASCII address (international addresses are not supported)", where, a.Address)
			}
			if p := envelopeProblem(a.Address); p != "" {
				return nil, effects.Permanentf(intent.CodeEffectFailed, "smtp: %s: %q cannot be sent: %s", where, a.Address, p)
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
