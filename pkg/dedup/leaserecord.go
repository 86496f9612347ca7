package dedup

import (
	"math"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// leaseRecord is a Lease's record between its writes, kept in less memory
// than a Record (192 bytes against 352): a leased record is unresolved
// until the lease's last write, so the members only a settled, parked or
// probed record has (result, error, completion time, receipt, signature,
// intent, decision, probe) are kept aside behind one pointer, nil while
// they are all zero; and its times are Unix nanoseconds. A record whose
// times would not come back the same from Unix nanoseconds (outside the
// years 1678 to 2262, or not in UTC) is kept whole aside.
type leaseRecord struct {
	status                           intent.Status
	tool, session, fingerprint       string
	holder, callID                   string
	attempt, attempts                int
	intentSeq                        uint64
	submissions                      []string
	leaseUntil, createdAt, updatedAt int64 // Unix nanoseconds; zeroTime for the zero time
	retentionSeconds                 int64
	// aside holds the members kept aside (the others zero), or, when
	// whole, the whole record; nil when there are none.
	aside *Record
	whole bool
}

// zeroTime stands for the zero time.Time in a leaseRecord.
const zeroTime = math.MinInt64

// leaseRecordOf returns r as a lease keeps it.
func leaseRecordOf(r Record) leaseRecord {
	lu, lok := nanos(r.LeaseUntil)
	ca, cok := nanos(r.CreatedAt)
	ua, uok := nanos(r.UpdatedAt)
	if !lok || !cok || !uok {
		return leaseRecord{aside: &r, whole: true}
	}
	lr := leaseRecord{
		status: r.Status, tool: r.Tool, session: r.Session, fingerprint: r.Fingerprint,
		holder: r.Holder, callID: r.CallID, attempt: r.Attempt, attempts: r.Attempts,
		intentSeq: r.IntentSeq, submissions: r.Submissions,
		leaseUntil: lu, createdAt: ca, updatedAt: ua, retentionSeconds: r.RetentionSeconds,
	}
	aside := Record{Result: r.Result, Error: r.Error, CompletedAt: r.CompletedAt, Receipt: r.Receipt,
		Signature: r.Signature, Intent: r.Intent, Decision: r.Decision, Probe: r.Probe}
	if aside.Result != nil || aside.Error != nil || !aside.CompletedAt.IsZero() || aside.Receipt != nil ||
		aside.Signature != nil || aside.Intent != nil || aside.Decision != nil || aside.Probe != nil {
		lr.aside = &aside
	}
	return lr
}

// record returns the Record lr keeps.
func (lr *leaseRecord) record() Record {
	if lr.whole {
		return *lr.aside
	}
	var r Record
	if lr.aside != nil {
		r = *lr.aside
	}
	r.Status, r.Tool, r.Session, r.Fingerprint = lr.status, lr.tool, lr.session, lr.fingerprint
	r.Holder, r.CallID, r.Attempt, r.Attempts = lr.holder, lr.callID, lr.attempt, lr.attempts
	r.IntentSeq, r.Submissions, r.RetentionSeconds = lr.intentSeq, lr.submissions, lr.retentionSeconds
	r.LeaseUntil, r.CreatedAt, r.UpdatedAt = fromNanos(lr.leaseUntil), fromNanos(lr.createdAt), fromNanos(lr.updatedAt)
	return r
}

// nanos returns t in Unix nanoseconds; ok is false when fromNanos would not
// give t back exactly.
func nanos(t time.Time) (n int64, ok bool) {
	if t.IsZero() {
		return zeroTime, true
	}
	n = t.UnixNano()
	return n, n != zeroTime && fromNanos(n) == t
}

// fromNanos is the time of n Unix nanoseconds, in UTC.
func fromNanos(n int64) time.Time {
	if n == zeroTime {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
