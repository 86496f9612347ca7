package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// attributionBundle builds synthetic sink logs, as cmd/sink writes them, for
// the attribution tests.
type attributionBundle struct {
	t0     time.Time
	ops    []*op
	log    strings.Builder
	events []event
	leases leaseLog
}

func newAttributionBundle() *attributionBundle {
	return &attributionBundle{t0: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), leases: newLeaseLog()}
}

func (b *attributionBundle) at(ms int) time.Time {
	return b.t0.Add(time.Duration(ms) * time.Millisecond)
}

// op adds an operation of tool, answered completed once, whose final ledger
// record is recordHolder's.
func (b *attributionBundle) op(tool, recordHolder string) *op {
	n := len(b.ops)
	o := &op{id: fmt.Sprintf("op-%07d", n), n: n, kind: kindSingle, tool: tool, key: fmt.Sprintf("%s.k%d", tool, n), fp: "fp", recordHolder: recordHolder}
	o.copies = []copyOut{{Published: true, Via: "answer", Status: intent.StatusCompleted, Result: []byte(`1`)}}
	b.ops = append(b.ops, o)
	return o
}

// fire logs a request of o by holder under claim attempt, arrived at ms.
func (b *attributionBundle) fire(o *op, ms, status int, holder string, attempt int) {
	at := b.at(ms)
	fmt.Fprintf(&b.log, `{"time":%q,"received":%q,"key":%q,"tool":%q,"status":%d,"holder":%q,"attempt":%d,"payload":{"op":%q}}`+"\n",
		at.Add(5*time.Millisecond).Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), o.key, o.tool, status, holder, attempt, o.id)
}

func (b *attributionBundle) kill(holder string, ms int) {
	b.events = append(b.events, event{Kind: faultWorkerKill, Target: holder, At: b.at(ms), Until: b.at(ms + 20)})
}

// judge judges the bundle with workers of the given concurrency.
func (b *attributionBundle) judge(t *testing.T, concurrency int, caps map[string]int, allowOutage bool) *Verdict {
	t.Helper()
	reqs, err := parseSinkLog(strings.NewReader(b.log.String()))
	require.NoError(t, err)
	v := &Verdict{}
	judge(v, runFacts{ops: b.ops, reqs: reqs, events: b.events, leases: b.leases, concurrency: concurrency, caps: caps, allowOutage: allowOutage})
	return v
}

// A live holder fires 200 operations, and another fires all of them again
// 20 s later under a higher claim, while an unrelated worker is killed once
// in between: nothing explains the repeats.
func TestJudgeLiveHolderRepeatsWithAnUnrelatedKill(t *testing.T) {
	t.Parallel()
	b := newAttributionBundle()
	for i := range 200 {
		o := b.op(toolName, "w3.1")
		b.fire(o, i, 200, "w1.1", 1)
		b.fire(o, 20000+i, 200, "w3.1", 2)
	}
	b.kill("w2.1", 10000)
	v := b.judge(t, 64, nil, false)
	require.Equal(t, 200, v.FiredMoreThanOnce)
	require.Zero(t, v.RepeatsCrash, "w2.1 held none of the keys")
	require.Equal(t, 200, v.RepeatsUnexplain)
	require.False(t, v.OK, "a live holder fired 200 operations twice")
	require.Contains(t, strings.Join(v.Violations, "\n"), "200 operations fired again while the earlier firing's holder was alive and connected")
}

// A second firing under the same claim number is a double firing, even when
// the first holder was killed in between: a takeover claims a higher one.
func TestJudgeSameAttemptRepeat(t *testing.T) {
	t.Parallel()
	b := newAttributionBundle()
	o := b.op(toolName, "w2.1")
	b.fire(o, 0, 200, "w1.1", 1)
	b.kill("w1.1", 50)
	b.fire(o, 5000, 200, "w2.1", 1)
	retried := b.op(toolName, "w3.1")
	b.fire(retried, 0, 200, "w3.1", 1)
	b.fire(retried, 300, 200, "w3.1", 1) // the same holder and claim, again
	v := b.judge(t, 64, nil, false)
	require.Equal(t, 2, v.RepeatsSameAtt)
	require.Zero(t, v.RepeatsCrash)
	require.False(t, v.OK)
	require.Contains(t, strings.Join(v.Violations, "\n"), "2 operations fired twice under one claim")
}

// The earlier firing's own holder is killed while firing (after its first,
// failed, request and its successful retry); a takeover fires again under a
// higher claim: the crash window.
func TestJudgeKilledHolderMidFiring(t *testing.T) {
	t.Parallel()
	b := newAttributionBundle()
	o := b.op(toolName, "w2.1")
	b.fire(o, 0, 503, "w1.1", 1)
	b.fire(o, 30, 200, "w1.1", 1)
	b.kill("w1.1", 40)
	b.fire(o, 4000, 503, "w2.1", 2)
	b.fire(o, 4020, 200, "w2.1", 2)
	v := b.judge(t, 64, nil, false)
	require.True(t, v.OK, v.Violations)
	require.Equal(t, 1, v.RepeatsCrash)
	require.Equal(t, []KillRepeats{{Holder: "w1.1", At: b.at(40), Repeats: 1, Bound: 1, Unrecorded: 1}}, v.CrashPerKill)
	require.Equal(t, 1, v.CrashMaxPerKill)
	require.Equal(t, 1, v.CrashMaxBound)
	require.Equal(t, []string{"w1.1", "w2.1"}, v.Repeats[0].Holders)
	require.Equal(t, []int{1, 2}, v.Repeats[0].Attempts)
}

// The earlier holder logged, for the key, that the ledger was unreachable
// past its lease deadline: an outage repeat, counted apart from the crash
// window, accepted only with --allow-outage-repeats.
func TestJudgeCutOffHolder(t *testing.T) {
	t.Parallel()
	b := newAttributionBundle()
	o := b.op(toolName, "w2.1")
	b.fire(o, 0, 200, "w1.1", 1)
	b.leases.cutOff[holderKey{"w1.1", o.key}] = b.at(2500)
	b.events = append(b.events, event{Kind: faultLedgerOutage, Target: "n1", At: b.at(100), Until: b.at(80000)})
	b.fire(o, 85000, 200, "w2.1", 2)

	v := b.judge(t, 64, nil, true)
	require.True(t, v.OK, v.Violations)
	require.Equal(t, 1, v.RepeatsOutage)
	require.Zero(t, v.RepeatsCrash)
	require.Empty(t, v.CrashPerKill)

	strict := b.judge(t, 64, nil, false)
	require.Equal(t, []string{"1 operations fired again while their holder, cut off from the ledger, was alive or had given its outcome up"}, strict.Violations)
}

// A holder cut off from the ledger keeps its outcome and goes on trying to
// record it, so a kill after the outage is what ended it: the crash window.
// A holder that logged it gave its outcome up (the worker stopped before the
// ledger took it) and was killed later: not the crash window.
func TestJudgeCutOffBeforeTheKill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		gaveUp bool
		killAt int
		want   string
	}{
		{"cut off, then killed", false, 80000, causeCrash},
		{"killed first", false, 2000, causeCrash},
		{"gave its outcome up, then killed", true, 80000, causeCutOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newAttributionBundle()
			o := b.op(toolName, "w2.1")
			b.fire(o, 0, 200, "w1.1", 1)
			b.leases.cutOff[holderKey{"w1.1", o.key}] = b.at(2500)
			if tc.gaveUp {
				b.leases.gaveUp[holderKey{"w1.1", o.key}] = b.at(70000)
			}
			b.kill("w1.1", tc.killAt)
			b.fire(o, 85000, 200, "w2.1", 2)
			v := b.judge(t, 64, nil, false)
			require.Equal(t, tc.want, v.Repeats[0].Cause)
		})
	}
}

// A kill explains at most what its holder could have had fired and not
// recorded: its concurrency, a capped tool's max_in_flight, and the
// operations the sink saw it start whose final record is not its own.
func TestJudgeCrashRepeatsPerKillAreBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		repeats     int
		tool        string
		caps        map[string]int
		recordedBy  string // the final record's holder of every operation
		concurrency int
		bound       int
	}{
		{"within the concurrency", 4, toolName, nil, "w2.1", 4, 4},
		{"beyond the concurrency", 5, toolName, nil, "w2.1", 4, 4},
		{"beyond a capped tool's max_in_flight", 2, cappedTool, map[string]int{cappedTool: 1}, "w2.1", 64, 1},
		{"operations the killed holder recorded itself", 3, toolName, nil, "w1.1", 64, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newAttributionBundle()
			for i := range tc.repeats {
				o := b.op(tc.tool, tc.recordedBy)
				b.fire(o, i, 200, "w1.1", 1)
				b.fire(o, 5000+i, 200, "w2.1", 2)
			}
			b.kill("w1.1", 100)
			v := b.judge(t, tc.concurrency, tc.caps, false)
			require.Equal(t, tc.repeats, v.RepeatsCrash)
			require.Len(t, v.CrashPerKill, 1)
			require.Equal(t, tc.bound, v.CrashPerKill[0].Bound)
			require.Equal(t, tc.repeats, v.CrashMaxPerKill)
			require.Equal(t, tc.bound, v.CrashMaxBound)
			if tc.repeats <= tc.bound {
				require.True(t, v.OK, v.Violations)
				return
			}
			require.False(t, v.OK)
			require.Contains(t, strings.Join(v.Violations, "\n"), fmt.Sprintf("1 worker kills explain more repeats than their holder could have had in flight: w1.1 %d > %d", tc.repeats, tc.bound))
		})
	}
}

// A worker's log lines count for the holder whose log it is.
func TestReadLeaseLines(t *testing.T) {
	t.Parallel()
	out := newLeaseLog()
	readLeaseLines(strings.NewReader(
		`{"level":"info","ts":1767323045.5,"msg":"lease taken over","key":"k1","attempt":2}`+"\n"+
			`{"level":"warn","ts":1767323046.25,"msg":"ledger unreachable past the lease deadline; cancelling the effect","key":"k2"}`+"\n"+
			`{"level":"warn","ts":1767323046.0,"msg":"ledger unreachable past the lease deadline; cancelling the effect","key":"k2"}`+"\n"+
			`{"level":"warn","ts":1767323047,"msg":"lease lost before recording; answering with the holder's outcome","key":"k3"}`+"\n"+
			`{"level":"error","ts":1767323049,"msg":"outcome not recorded: the worker stopped before the ledger took it","key":"k4"}`+"\n"+
			`{"level":"info","ts":1767323048,"msg":"worker consuming","holder":"w2.3"}`+"\n"+
			`not json, lease lost`+"\n"), "w2.3", out)
	require.Equal(t, time.Unix(1767323045, 5e8), out.takeover["k1"])
	require.Equal(t, map[holderKey]time.Time{{"w2.3", "k2"}: time.Unix(1767323046, 0)}, out.cutOff, "the first line for the key")
	require.Equal(t, map[holderKey]time.Time{{"w2.3", "k3"}: time.Unix(1767323047, 0)}, out.lost)
	require.Equal(t, map[holderKey]time.Time{{"w2.3", "k4"}: time.Unix(1767323049, 0)}, out.gaveUp)
}
