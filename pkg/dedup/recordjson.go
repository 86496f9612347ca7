package dedup

import (
	"fmt"
	"strconv"

	"github.com/idemgate/idemgate/pkg/intent"
)

// marshal encodes r as it is stored: the members, order and omissions of
// Record's json tags (what encoding/json writes), without reflection, raw
// JSON (the result, a kept intent) copied as it is once checked.
func (r Record) marshal() ([]byte, error) {
	size := 512 + len(r.Result) + len(r.Intent)
	if s := r.Signature; s != nil {
		size += len(s.Key) + len(s.Holder) + len(s.Signer) + len(s.Sig) + len(s.Proof)
	} else {
		size += len(r.Receipt)
	}
	b, err := r.appendJSON(make([]byte, 0, size))
	if err != nil {
		return nil, fmt.Errorf("encode record: %w", err)
	}
	return b, nil
}

func (r Record) appendJSON(b []byte) ([]byte, error) {
	var err error
	member := intent.AppendJSONMember
	b = append(b, '{')
	b = intent.AppendJSONString(member(b, "status"), string(r.Status))
	if r.Tool != "" {
		b = intent.AppendJSONString(member(b, "tool"), r.Tool)
	}
	if r.Session != "" {
		b = intent.AppendJSONString(member(b, "session"), r.Session)
	}
	b = intent.AppendJSONString(member(b, "fingerprint"), r.Fingerprint)
	if r.Holder != "" {
		b = intent.AppendJSONString(member(b, "holder"), r.Holder)
	}
	if !r.LeaseUntil.IsZero() {
		if b, err = intent.AppendJSONTime(member(b, "lease_until"), r.LeaseUntil); err != nil {
			return nil, err
		}
	}
	b = strconv.AppendInt(member(b, "attempt"), int64(r.Attempt), 10)
	b = strconv.AppendInt(member(b, "attempts"), int64(r.Attempts), 10)
	if len(r.Result) > 0 {
		if b, err = intent.AppendJSONRaw(member(b, "result"), r.Result); err != nil {
			return nil, fmt.Errorf("result: %w", err)
		}
	}
	if r.Error != nil {
		b = r.Error.AppendJSON(member(b, "error"))
	}
	if r.IntentSeq != 0 {
		b = strconv.AppendUint(member(b, "intent_seq"), r.IntentSeq, 10)
	}
	if r.CallID != "" {
		b = intent.AppendJSONString(member(b, "call_id"), r.CallID)
	}
	if len(r.Submissions) > 0 {
		b = append(member(b, "submissions"), '[')
		for i, s := range r.Submissions {
			if i > 0 {
				b = append(b, ',')
			}
			b = intent.AppendJSONString(b, s)
		}
		b = append(b, ']')
	}
	if len(r.Intent) > 0 {
		if b, err = intent.AppendJSONRaw(member(b, "intent"), r.Intent); err != nil {
			return nil, fmt.Errorf("intent: %w", err)
		}
	}
	if d := r.Decision; d != nil {
		b = intent.AppendJSONString(member(append(member(b, "decision"), '{'), "op"), d.Op)
		if d.By != "" {
			b = intent.AppendJSONString(member(b, "by"), d.By)
		}
		if d.Reason != "" {
			b = intent.AppendJSONString(member(b, "reason"), d.Reason)
		}
		if b, err = intent.AppendJSONTime(member(b, "at"), d.At); err != nil {
			return nil, err
		}
		if !d.Until.IsZero() {
			if b, err = intent.AppendJSONTime(member(b, "until"), d.Until); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	if p := r.Probe; p != nil {
		if b, err = intent.AppendJSONTime(member(append(member(b, "probe"), '{'), "at"), p.At); err != nil {
			return nil, err
		}
		b = intent.AppendJSONString(member(b, "key"), p.Key)
		b = intent.AppendJSONString(member(b, "verdict"), p.Verdict)
		b = intent.AppendJSONString(member(b, "request"), p.Request)
		if p.Status != "" {
			b = intent.AppendJSONString(member(b, "status"), p.Status)
		}
		if p.Body != "" {
			b = intent.AppendJSONString(member(b, "body"), p.Body)
		}
		b = append(b, '}')
	}
	if b, err = intent.AppendJSONTime(member(b, "created_at"), r.CreatedAt); err != nil {
		return nil, err
	}
	if b, err = intent.AppendJSONTime(member(b, "updated_at"), r.UpdatedAt); err != nil {
		return nil, err
	}
	if !r.CompletedAt.IsZero() {
		if b, err = intent.AppendJSONTime(member(b, "completed_at"), r.CompletedAt); err != nil {
			return nil, err
		}
	}
	if s := r.Signature; s != nil {
		b = intent.AppendJSONString(member(append(member(b, "signature"), '{'), "key"), s.Key)
		if s.Holder != "" {
			b = intent.AppendJSONString(member(b, "holder"), s.Holder)
		}
		b = intent.AppendJSONString(member(b, "signer"), s.Signer)
		b = intent.AppendJSONString(member(b, "sig"), s.Sig)
		if s.Proof != "" {
			b = intent.AppendJSONString(member(b, "proof"), s.Proof)
		}
		b = append(b, '}')
	} else if len(r.Receipt) > 0 {
		if b, err = intent.AppendJSONSigned(member(b, "receipt"), r.Receipt); err != nil {
			return nil, fmt.Errorf("receipt: %w", err)
		}
	}
	if r.RetentionSeconds != 0 {
		b = strconv.AppendInt(member(b, "retention_seconds"), r.RetentionSeconds, 10)
	}
	return append(b, '}'), nil
}
