package dedup

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The state machine's rules, on records as data: no server.

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// heldAt is a pending record of holder w1 with a lease of a minute from at.
func heldAt(at time.Time) Record {
	return Record{Status: intent.StatusPending, Tool: "refund", Fingerprint: "fp", Holder: "w1", LeaseUntil: at.Add(time.Minute),
		Attempt: 1, IntentSeq: 3, CallID: "c1", CreatedAt: at, UpdatedAt: at}
}

func TestClaimDecision(t *testing.T) {
	t.Parallel()
	req := ClaimRequest{Key: "refund.1", Tool: "refund", Fingerprint: "fp", Holder: "w2", Lease: 30 * time.Second, IntentSeq: 9, CallID: "c2"}
	approved := heldAt(t0)
	approved.Status, approved.Holder = intent.StatusApproved, ""
	approved.Decision = &Decision{Op: intent.ControlApprove, At: t0, Until: t0.Add(time.Hour)}
	released := release(1).apply(heldAt(t0), t0)
	with := func(s intent.Status) Record { r := heldAt(t0); r.Status = s; r.LeaseUntil = time.Time{}; return r }
	for _, tc := range []struct {
		name    string
		cur     Record
		rev     uint64
		pol     policy
		req     func(ClaimRequest) ClaimRequest
		now     time.Time
		want    Outcome
		attempt int // the written record's attempt, for Acquired and TookOver
	}{
		{name: "OtherArguments", cur: heldAt(t0), req: func(r ClaimRequest) ClaimRequest { r.Fingerprint = "other"; return r }, now: t0, want: Conflict},
		{name: "OtherArgumentsOfAnAnswer", cur: with(intent.StatusCompleted), req: func(r ClaimRequest) ClaimRequest { r.Fingerprint = "other"; return r }, now: t0, want: Conflict},
		{name: "Completed", cur: with(intent.StatusCompleted), now: t0, want: Done},
		{name: "Failed", cur: with(intent.StatusFailed), now: t0, want: Done},
		{name: "Denied", cur: with(intent.StatusDenied), now: t0, want: Done},
		{name: "AwaitingApproval", cur: with(intent.StatusAwaitingApproval), now: t0, want: Done},
		{name: "Uncertain", cur: with(intent.StatusUncertain), now: t0, want: Done},
		{name: "LiveLease", cur: heldAt(t0), now: t0.Add(59 * time.Second), want: Busy},
		{name: "ExpiredLease", cur: heldAt(t0), now: t0.Add(time.Minute), want: TookOver, attempt: 2},
		{name: "ExpiredUnconfirmed", cur: heldAt(t0), rev: 5, pol: policy{confirmTakeover: true}, now: t0.Add(time.Hour), want: Busy},
		{name: "ExpiredConfirmedElsewhere", cur: heldAt(t0), rev: 5, pol: policy{confirmTakeover: true},
			req: func(r ClaimRequest) ClaimRequest { r.Confirmed = 4; return r }, now: t0.Add(time.Hour), want: Busy},
		{name: "ExpiredConfirmed", cur: heldAt(t0), rev: 5, pol: policy{confirmTakeover: true},
			req: func(r ClaimRequest) ClaimRequest { r.Confirmed = 5; return r }, now: t0.Add(time.Hour), want: TookOver, attempt: 2},
		{name: "Released", cur: released, now: t0, want: Acquired, attempt: 2},
		{name: "ReleasedNeedsNoConfirmation", cur: released, pol: policy{confirmTakeover: true}, now: t0, want: Acquired, attempt: 2},
		{name: "Approved", cur: approved, now: t0, want: Acquired, attempt: 2},
		{name: "FailedRetried", cur: with(intent.StatusFailed), req: retryFailed, now: t0, want: Acquired, attempt: 2},
		{name: "FailedRetriedNeedsNoConfirmation", cur: with(intent.StatusFailed), rev: 5, pol: policy{confirmTakeover: true}, req: retryFailed,
			now: t0, want: Acquired, attempt: 2},
		{name: "FailedRetriedOtherArguments", cur: with(intent.StatusFailed),
			req: func(r ClaimRequest) ClaimRequest { r.RetryFailed, r.Fingerprint = true, "other"; return r }, now: t0, want: Conflict},
		{name: "FailedRetriedByANewCall", cur: failedBy("sub-a"), now: t0, want: Acquired, attempt: 2,
			req: func(r ClaimRequest) ClaimRequest { r.RetryFailed, r.Submission = true, "sub-b"; return r }},
		{name: "FailedCopyOfTheCall", cur: failedBy("sub-a"), now: t0, want: Done,
			req: func(r ClaimRequest) ClaimRequest { r.RetryFailed, r.Submission = true, "sub-a"; return r }},
		{name: "FailedCopyOfAnEarlierCall", cur: failedBy("sub-a", "sub-b"), now: t0, want: Done,
			req: func(r ClaimRequest) ClaimRequest { r.RetryFailed, r.Submission = true, "sub-a"; return r }},
		{name: "FailedMessageDeliveredAgain", cur: failedBy(), now: t0, want: Done,
			req: func(r ClaimRequest) ClaimRequest { r.RetryFailed, r.IntentSeq = true, 3; return r }},
		{name: "FailedMessageDeliveredAgainNamingAnotherCall", cur: failedBy("sub-a"), now: t0, want: Done,
			req: func(r ClaimRequest) ClaimRequest {
				r.RetryFailed, r.IntentSeq, r.Submission = true, 3, "sub-x"
				return r
			}},
		{name: "CompletedNotRetried", cur: with(intent.StatusCompleted), req: retryFailed, now: t0, want: Done},
		{name: "DeniedNotRetried", cur: with(intent.StatusDenied), req: retryFailed, now: t0, want: Done},
		{name: "UncertainNotRetried", cur: with(intent.StatusUncertain), req: retryFailed, now: t0, want: Done},
		{name: "LiveLeaseNotRetried", cur: heldAt(t0), req: retryFailed, now: t0, want: Busy},
		{name: "Forgotten", cur: tombstone(with(intent.StatusCompleted), "ops", "", t0), now: t0, want: Acquired, attempt: 1},
		{name: "ForgottenOtherArguments", cur: tombstone(with(intent.StatusCompleted), "ops", "", t0), now: t0,
			req: func(r ClaimRequest) ClaimRequest { r.Fingerprint = "other"; return r }, want: Acquired, attempt: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := req
			if tc.req != nil {
				r = tc.req(req)
			}
			step := tc.pol.claim(tc.cur, tc.rev, r, tc.now)
			require.Equal(t, tc.want, step.outcome)
			require.Equal(t, tc.want == Acquired || tc.want == TookOver, step.writes())
			if !step.writes() {
				return
			}
			next := step.next
			require.Equal(t, intent.StatusPending, next.Status)
			require.Equal(t, "w2", next.Holder)
			require.Equal(t, tc.now.Add(r.Lease), next.LeaseUntil)
			require.Equal(t, tc.attempt, next.Attempt)
			require.Equal(t, r.IntentSeq, next.IntentSeq)
			require.Equal(t, "c2", next.CallID)
			require.Equal(t, tc.now, next.UpdatedAt)
			require.Equal(t, tc.cur.CreatedAt, next.CreatedAt, "the operation's creation stays")
			if tc.want == TookOver {
				require.Equal(t, tc.cur.Attempts+1, next.Attempts, "the vanished holder's attempt counts")
			} else {
				require.Equal(t, tc.cur.Attempts, next.Attempts, "the effect's invocations so far stay")
			}
			if tc.cur.Status == intent.StatusForgotten {
				require.Equal(t, claimed(r, tc.now), next, "a forgotten record is claimed anew")
				return
			}
			require.Equal(t, tc.cur.Decision, next.Decision, "an approval stays for the claimant to check")
		})
	}
}

// retryFailed is a claim of a tool whose failures a later call retries.
func retryFailed(r ClaimRequest) ClaimRequest { r.RetryFailed = true; return r }

// failedBy is a failed record of intent message 3, claimed by the calls
// named (the latest last).
func failedBy(calls ...string) Record {
	r := fail(intent.Error{Code: intent.CodeEffectFailed, Message: "422"}, 1).apply(heldAt(t0), t0)
	r.Submissions = calls
	return r
}

// A failed operation of a tool that retries failures runs again for a new
// call only: a copy of a call that ran it (the same message delivered
// again, a republish or a front door's repeat naming the same call) gets
// the failure. A caller cannot make another's failure run again otherwise
// than as a new call, which on_failure: retry lets run anyway; naming
// another's call only gets that call's failure.
func TestFailureRunsAgainOnlyForANewCall(t *testing.T) {
	t.Parallel()
	pol := policy{}
	cur := failedBy("sub-a")
	req := ClaimRequest{Key: "refund.1", Tool: "refund", Fingerprint: "fp", Holder: "w2", Lease: time.Minute, RetryFailed: true}

	copyOf := req
	copyOf.IntentSeq, copyOf.Submission = 7, "sub-a" // the call's republished copy
	require.Equal(t, Done, pol.claim(cur, 4, copyOf, t0.Add(time.Second)).outcome, "a republished copy of the call that failed")
	require.True(t, cur.CausedBy(7, "sub-a"), "and the failure is its own call's: no replay")

	again := req
	again.IntentSeq = 3 // the message that failed, delivered again
	require.Equal(t, Done, pol.claim(cur, 4, again, t0.Add(time.Second)).outcome, "the message that failed, delivered again")

	fresh := req
	fresh.IntentSeq, fresh.Submission = 8, "sub-b"
	step := pol.claim(cur, 4, fresh, t0.Add(time.Second))
	require.Equal(t, Acquired, step.outcome, "a new call runs it again")
	require.Equal(t, []string{"sub-a", "sub-b"}, step.next.Submissions, "the record names both calls, the latest last")
	require.False(t, step.next.CausedBy(7, "sub-a"))

	// The retry failed too: neither call's copies run it a third time.
	twice := fail(intent.Error{Code: intent.CodeEffectFailed, Message: "422"}, 2).apply(step.next, t0.Add(2*time.Second))
	for _, sub := range []string{"sub-a", "sub-b"} {
		c := req
		c.IntentSeq, c.Submission = 20, sub
		require.Equal(t, Done, pol.claim(twice, 6, c, t0.Add(3*time.Second)).outcome, "a copy of call %s", sub)
	}
	anon := req
	anon.IntentSeq = 21 // a hand-made intent naming no call: a new call
	require.Equal(t, Acquired, pol.claim(twice, 6, anon, t0.Add(3*time.Second)).outcome)
}

// A record names at most MaxSubmissions calls, the latest last; a call
// that claims again moves to the end.
func TestRecordNamesItsLatestCalls(t *testing.T) {
	t.Parallel()
	var subs []string
	for i := range MaxSubmissions + 3 {
		subs = ranBy(subs, fmt.Sprintf("call-%02d", i))
	}
	require.Len(t, subs, MaxSubmissions)
	require.Equal(t, "call-03", subs[0])
	require.Equal(t, fmt.Sprintf("call-%02d", MaxSubmissions+2), subs[MaxSubmissions-1])
	moved := ranBy(subs, "call-05")
	require.Len(t, moved, MaxSubmissions)
	require.Equal(t, "call-05", moved[MaxSubmissions-1])
	require.Equal(t, "call-05", subs[2], "the record's own list is not changed")
	require.Equal(t, subs, ranBy(subs, ""), "an intent naming no call adds none")
}

// A failure taken over for a retry leaves nothing of the failure in the
// record: the next answer is the retry's own outcome.
func TestRetriedFailure(t *testing.T) {
	t.Parallel()
	failed := fail(intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 2).apply(heldAt(t0), t0)
	failed.Receipt = json.RawMessage(`{"sig":"x"}`)
	failed.Decision = &Decision{Op: intent.ControlApprove, At: t0, Until: t0.Add(time.Hour)}
	req := ClaimRequest{Key: "refund.1", Tool: "refund", Fingerprint: "fp", Holder: "w2", Lease: time.Minute, IntentSeq: 9, RetryFailed: true}
	step := policy{}.claim(failed, 4, req, t0.Add(time.Second))
	require.Equal(t, Acquired, step.outcome)
	next := step.next
	require.Equal(t, intent.StatusPending, next.Status)
	require.Nil(t, next.Error)
	require.Nil(t, next.Result)
	require.Nil(t, next.Receipt)
	require.Nil(t, next.Decision, "the approval of the firing that failed does not approve the retry")
	require.True(t, next.CompletedAt.IsZero())
	require.Equal(t, 2, next.Attempts, "the effect's invocations so far stay")
	require.Equal(t, 2, next.Attempt)
	require.False(t, next.LeaseExpired(t0.Add(time.Second)))
	require.Equal(t, Done, policy{}.claim(failed, 4, ClaimRequest{Fingerprint: "fp", Holder: "w2"}, t0).outcome, "without RetryFailed the failure answers")
}

func TestClaimedRecord(t *testing.T) {
	t.Parallel()
	req := ClaimRequest{Key: "k", Tool: "refund", Session: "s", Fingerprint: "fp", Holder: "w1", Lease: time.Minute, IntentSeq: 4, CallID: "c"}
	require.Equal(t, Record{Status: intent.StatusPending, Tool: "refund", Session: "s", Fingerprint: "fp", Holder: "w1",
		LeaseUntil: t0.Add(time.Minute), Attempt: 1, IntentSeq: 4, CallID: "c", CreatedAt: t0, UpdatedAt: t0}, claimed(req, t0))
}

func TestFreshLease(t *testing.T) {
	t.Parallel()
	r := heldAt(t0) // a minute's lease from t0
	require.True(t, fresh(r, time.Minute, t0))
	require.True(t, fresh(r, time.Minute, t0.Add(29*time.Second)))
	require.False(t, fresh(r, time.Minute, t0.Add(30*time.Second)), "half the lease gone")
	require.False(t, fresh(r, time.Minute, t0.Add(2*time.Minute)))
}

// Every holder's transition, from a pending record: what it sets, what it
// keeps, and the time of the write.
func TestLeaseTransitions(t *testing.T) {
	t.Parallel()
	now := t0.Add(10 * time.Second)
	result := json.RawMessage(`{"ok":true}`)
	for _, tc := range []struct {
		name string
		t    transition
		want func(r Record) Record
	}{
		{"Extend", extend(time.Hour), func(r Record) Record { r.LeaseUntil = now.Add(time.Hour); return r }},
		{"Complete", complete(result, 2), func(r Record) Record {
			r.Status, r.Result, r.Attempts, r.LeaseUntil, r.CompletedAt = intent.StatusCompleted, result, 2, time.Time{}, now
			return r
		}},
		{"Fail", fail(intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 3), func(r Record) Record {
			r.Status, r.Attempts, r.LeaseUntil, r.CompletedAt = intent.StatusFailed, 3, time.Time{}, now
			r.Error = &intent.Error{Code: intent.CodeEffectFailed, Message: "no"}
			return r
		}},
		{"Release", release(2), func(r Record) Record { r.Holder, r.LeaseUntil, r.Attempts = "", now, 2; return r }},
		{"AwaitApproval", awaitApproval(json.RawMessage(`{"tool":"refund"}`)), func(r Record) Record {
			r.Status, r.Intent, r.Holder, r.LeaseUntil = intent.StatusAwaitingApproval, json.RawMessage(`{"tool":"refund"}`), "", time.Time{}
			return r
		}},
		{"Hold", hold("gone"), func(r Record) Record { // the takeover counted the vanished holder's attempt already
			r.Status, r.Holder, r.LeaseUntil = intent.StatusUncertain, "", time.Time{}
			r.Error = &intent.Error{Code: intent.CodeUncertain, Message: "gone"}
			return r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want := tc.want(heldAt(t0))
			want.UpdatedAt = now
			require.Equal(t, want, tc.t.apply(heldAt(t0), now))
		})
	}
	// Released: pending, no holder, claimable at once.
	r := release(1).apply(heldAt(t0), now)
	require.True(t, r.Released())
	require.True(t, r.LeaseExpired(now))
	require.False(t, r.abandoned(now), "released, not abandoned")
	require.True(t, r.settled(now), "a waiter claims it")
	// A completed record keeps no lease: it never expires into a takeover.
	require.False(t, complete(nil, 1).apply(heldAt(t0), now).LeaseExpired(now.Add(time.Hour)))
}

// Every operator decision from every status: applied, the same answer again
// (no change), or the wrong state.
func TestOperatorDecisions(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	approvedOnce := func(s intent.Status) Record {
		r := heldAt(t0)
		r.Status = s
		r.Decision = &Decision{Op: intent.ControlApprove, By: "ops", At: t0, Until: t0.Add(time.Hour)}
		return r
	}
	status := func(s intent.Status) Record { r := heldAt(t0); r.Status = s; return r }
	const (
		applied = "applied"
		same    = "same"
	)
	for _, tc := range []struct {
		name string
		d    decision
		rec  Record
		want any // applied, same, or the error
	}{
		{"ApproveAwaiting", approval("fp", "ops", "ok", time.Hour), status(intent.StatusAwaitingApproval), applied},
		{"ApproveAnyArguments", approval("", "ops", "ok", time.Hour), status(intent.StatusAwaitingApproval), applied},
		{"ApproveOtherArguments", approval("other", "ops", "", time.Hour), status(intent.StatusAwaitingApproval), ErrFingerprintMismatch},
		{"ApproveAgain", approval("fp", "ops", "", time.Hour), approvedOnce(intent.StatusApproved), same},
		{"ApproveFiring", approval("fp", "ops", "", time.Hour), approvedOnce(intent.StatusPending), same},
		{"ApproveFired", approval("fp", "ops", "", time.Hour), approvedOnce(intent.StatusCompleted), same},
		{"ApproveFailedAfterApproval", approval("fp", "ops", "", time.Hour), approvedOnce(intent.StatusFailed), same},
		{"ApproveNeverAwaited", approval("fp", "ops", "", time.Hour), status(intent.StatusCompleted), ErrWrongState},
		{"ApprovePending", approval("fp", "ops", "", time.Hour), status(intent.StatusPending), ErrWrongState},
		{"ApproveDenied", approval("fp", "ops", "", time.Hour), status(intent.StatusDenied), ErrWrongState},
		{"ApproveUncertain", approval("fp", "ops", "", time.Hour), status(intent.StatusUncertain), ErrWrongState},
		{"DenyAwaiting", denial("ops", "no"), status(intent.StatusAwaitingApproval), applied},
		{"DenyApproved", denial("ops", "no"), approvedOnce(intent.StatusApproved), applied},
		{"DenyAgain", denial("ops", "no"), status(intent.StatusDenied), same},
		{"DenyFiring", denial("ops", "no"), approvedOnce(intent.StatusPending), ErrWrongState},
		{"DenyCompleted", denial("ops", "no"), status(intent.StatusCompleted), ErrWrongState},
		{"ResolveSucceeded", resolution(true, json.RawMessage(`1`), "ops", ""), status(intent.StatusUncertain), applied},
		{"ResolveFailed", resolution(false, nil, "ops", "bounced"), status(intent.StatusUncertain), applied},
		{"ResolvePending", resolution(true, nil, "ops", ""), status(intent.StatusPending), ErrWrongState},
		{"ResolveCompleted", resolution(true, nil, "ops", ""), status(intent.StatusCompleted), ErrWrongState},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			next, changed, err := tc.d(tc.rec, now)
			switch tc.want {
			case applied:
				require.NoError(t, err)
				require.True(t, changed)
				require.NotNil(t, next.Decision)
				require.Equal(t, now, next.Decision.At)
				require.Equal(t, "ops", next.Decision.By)
			case same:
				require.NoError(t, err)
				require.False(t, changed)
				require.Equal(t, tc.rec, next)
			default:
				require.ErrorIs(t, err, tc.want.(error))
				require.False(t, changed)
			}
		})
	}

	next, _, _ := approval("", "ops", "ok", time.Hour)(heldAt(t0), now)
	require.Equal(t, intent.StatusPending, next.Status, "a refused decision leaves the record")
	next, _, _ = approval("", "ops", "ok", time.Hour)(status(intent.StatusAwaitingApproval), now)
	require.Equal(t, intent.StatusApproved, next.Status)
	require.Equal(t, now.Add(time.Hour), next.Decision.Until)
	require.True(t, next.Approved(now))
	require.False(t, next.Approved(now.Add(time.Hour)), "an approval lapses")

	next, _, _ = denial("ops", "too much")(status(intent.StatusAwaitingApproval), now)
	require.Equal(t, intent.StatusDenied, next.Status)
	require.Equal(t, &intent.Error{Code: intent.CodeDenied, Message: "denied by ops: too much"}, next.Error)
	require.Nil(t, next.Intent, "a denied operation keeps no envelope to fire")
	require.Equal(t, now, next.CompletedAt)
	next, _, _ = denial("", "")(status(intent.StatusAwaitingApproval), now)
	require.Equal(t, "denied by an operator", next.Error.Message)

	next, _, _ = resolution(true, json.RawMessage(`{"sent":1}`), "ops", "")(status(intent.StatusUncertain), now)
	require.Equal(t, intent.StatusCompleted, next.Status)
	require.Equal(t, json.RawMessage(`{"sent":1}`), next.Result)
	require.Nil(t, next.Error)
	next, _, _ = resolution(false, nil, "ops", "bounced")(status(intent.StatusUncertain), now)
	require.Equal(t, intent.StatusFailed, next.Status)
	require.Equal(t, &intent.Error{Code: intent.CodeEffectFailed, Message: "resolved as failed by an operator: bounced"}, next.Error)
}

// What Forget may delete, forced or not, at each status.
func TestForgettable(t *testing.T) {
	t.Parallel()
	live := heldAt(t0)
	now := t0.Add(30 * time.Second)
	expired := heldAt(t0.Add(-time.Hour))
	released := release(1).apply(heldAt(t0), t0)
	status := func(s intent.Status) Record { r := heldAt(t0); r.Status = s; r.LeaseUntil = time.Time{}; return r }
	for _, tc := range []struct {
		name           string
		rec            Record
		plain, forced  error // nil: deleted
		firing, abandn bool
	}{
		{"Completed", status(intent.StatusCompleted), nil, nil, false, false},
		{"Failed", status(intent.StatusFailed), nil, nil, false, false},
		{"Denied", status(intent.StatusDenied), nil, nil, false, false},
		{"LiveLease", live, ErrInFlight, ErrInFlight, true, false},
		{"Approved", status(intent.StatusApproved), ErrInFlight, ErrInFlight, true, false},
		{"PastLease", expired, ErrUnresolved, nil, false, true},
		{"Released", released, ErrUnresolved, nil, false, false},
		{"AwaitingApproval", status(intent.StatusAwaitingApproval), ErrUnresolved, nil, false, false},
		{"Uncertain", status(intent.StatusUncertain), ErrUnresolved, nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			check := func(want, got error) {
				if want == nil {
					require.NoError(t, got)
					return
				}
				require.ErrorIs(t, got, want)
				require.False(t, errors.Is(got, ErrInFlight) && errors.Is(got, ErrUnresolved))
			}
			check(tc.plain, forgettable(tc.rec, now, false))
			check(tc.forced, forgettable(tc.rec, now, true))
			require.Equal(t, tc.firing, tc.rec.firing(now), "firing")
			require.Equal(t, tc.abandn, tc.rec.abandoned(now), "abandoned")
		})
	}
}

// What a waiter returns: an answer, or a record a claim may take.
func TestSettled(t *testing.T) {
	t.Parallel()
	for s, want := range map[intent.Status]bool{
		intent.StatusCompleted: true, intent.StatusFailed: true, intent.StatusDenied: true,
		intent.StatusAwaitingApproval: true, intent.StatusUncertain: true,
	} {
		r := heldAt(t0)
		r.Status = s
		require.Equal(t, want, r.settled(t0), s)
	}
	require.False(t, heldAt(t0).settled(t0), "a live lease")
	require.True(t, heldAt(t0).settled(t0.Add(time.Minute)), "a lease that ran out")
}

func TestRetentionRules(t *testing.T) {
	t.Parallel()
	p := policy{retention: time.Hour}
	for _, s := range []intent.Status{intent.StatusCompleted, intent.StatusFailed, intent.StatusDenied} {
		require.Equal(t, time.Hour, p.ttl(Record{Status: s}), s)
		require.Equal(t, time.Minute, p.ttl(Record{Status: s, RetentionSeconds: 60}), "%s: its own retention", s)
	}
	for _, s := range []intent.Status{intent.StatusPending, intent.StatusApproved, intent.StatusAwaitingApproval, intent.StatusUncertain} {
		require.Zero(t, p.ttl(Record{Status: s}), "%s never expires", s)
		require.Zero(t, p.ttl(Record{Status: s, RetentionSeconds: 60}), "%s never expires, whatever its retention", s)
	}
	r := Record{UpdatedAt: t0}
	require.Equal(t, 40*time.Minute, r.restOf(time.Hour, t0.Add(20*time.Minute)))
	require.Equal(t, time.Second, r.restOf(time.Hour, t0.Add(2*time.Hour)), "at least a second")
	require.Equal(t, time.Minute, heldAt(t0).leaseLength(), "the lease the holder took")
	require.Equal(t, DefaultLease, Record{}.leaseLength())
}
