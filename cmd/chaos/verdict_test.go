package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

func TestJudge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	done := func(result string) copyOut {
		return copyOut{Published: true, Via: "answer", Status: intent.StatusCompleted, Result: json.RawMessage(result)}
	}
	newOp := func(id string, copies ...copyOut) *op {
		return &op{id: id, kind: kindConcurrent, tool: toolName, key: "chaos_op." + id, fp: "fp-" + id, copies: copies, recordHolder: "w2.1"}
	}
	// hitBy is a request of o by holder under claim attempt.
	hitBy := func(o *op, ms, status int, holder string, attempt int) request {
		return request{Time: at(ms + 10), Arrived: at(ms), Key: o.key, Status: status, Holder: holder, Attempt: attempt, op: o.id}
	}
	// hit is a request of the first claim, by w1.1.
	hit := func(o *op, ms, status int) request { return hitBy(o, ms, status, "w1.1", 1) }
	kill := func(holder string, ms int) event {
		return event{Kind: faultWorkerKill, Target: holder, At: at(ms), Until: at(ms + 10)}
	}
	type bundle struct {
		ops    []*op
		reqs   []request
		events []event
		leases leaseLog
	}
	cases := []struct {
		name  string
		build func() bundle
		check func(t *testing.T, v *Verdict)
	}{
		{"clean run", func() bundle {
			a, b := newOp("a", done(`1`), done(`1`)), newOp("b", done(`2`))
			return bundle{ops: []*op{a, b}, reqs: []request{hit(a, 0, 503), hit(a, 5, 200), hit(b, 1, 200)}}
		}, func(t *testing.T, v *Verdict) {
			require.True(t, v.OK, v.Violations)
			require.Equal(t, 3, v.IntentsPublished)
			require.Equal(t, 2, v.UniqueOperations)
			require.Equal(t, 1, v.DuplicatesByKind[kindConcurrent])
			require.Equal(t, 2, v.EffectsObserved)
			require.Equal(t, 1, v.FaultsByKind[faultSink5xx])
			require.Equal(t, ToolCounts{Operations: 2, Fired: 2}, v.ByTool[toolName])
		}},
		{"lost operation", func() bundle {
			a := newOp("a", copyOut{Published: true})
			return bundle{ops: []*op{a}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.LostOperations)
			require.Equal(t, 1, v.Unanswered)
			require.Equal(t, ToolCounts{Operations: 1, Lost: 1, Unanswered: 1}, v.ByTool[toolName])
		}},
		{"completed but never fired", func() bundle {
			return bundle{ops: []*op{newOp("a", done(`1`))}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.CompletedNotFired)
		}},
		{"fired twice with no fault", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 3000, 200, "w2.1", 2)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsUnexplain)
		}},
		{"fired twice across a kill of its holder", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 3000, 200, "w2.1", 2)},
				events: []event{kill("w1.1", 50)}}
		}, func(t *testing.T, v *Verdict) {
			require.True(t, v.OK, v.Violations)
			require.Equal(t, 1, v.RepeatsCrash)
			require.Equal(t, 1, v.ExtraFirings)
			require.Equal(t, []KillRepeats{{Holder: "w1.1", At: at(50), Repeats: 1, Bound: 1, Unrecorded: 1}}, v.CrashPerKill)
			require.Equal(t, "w1.1", v.Repeats[0].Kill)
		}},
		{"a kill of another holder explains nothing", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 3000, 200, "w2.1", 2)},
				events: []event{kill("w3.1", 50)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsUnexplain)
			require.Zero(t, v.RepeatsCrash)
		}},
		{"a kill of the holder after the later firing explains nothing", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 3000, 200, "w2.1", 2)},
				events: []event{kill("w1.1", 3500)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsUnexplain)
		}},
		{"a JetStream outage alone explains nothing", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 3000, 200, "w2.1", 2)},
				events: []event{{Kind: faultJetStream, Target: "n1", At: at(100), Until: at(2500)}}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsUnexplain)
			require.Zero(t, v.RepeatsOutage)
		}},
		{"the holder's window starts at its claim's first request", func() bundle {
			a := newOp("a", done(`1`))
			l := newLeaseLog()
			l.cutOff[holderKey{"w1.1", a.key}] = at(2600)
			l.takeover[a.key] = at(3050)
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 503), hit(a, 3000, 200), hitBy(a, 3100, 200, "w2.1", 2)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}}, leases: l}
		}, func(t *testing.T, v *Verdict) {
			require.Equal(t, 1, v.RepeatsOutage, "cut off after its first (failed) request, before the takeover's firing")
			require.Zero(t, v.RepeatsUnexplain)
		}},
		{"a holder told its lease was lost before anyone took over", func() bundle {
			a := newOp("a", done(`1`))
			l := newLeaseLog()
			l.lost[holderKey{"w1.1", a.key}] = at(4000)
			l.takeover[a.key] = at(7000)
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 7000, 200, "w2.1", 2)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}}, leases: l}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsPhantom)
			require.Equal(t, 1, v.LiveLeaseLosses)
			require.Zero(t, v.RepeatsOutage)
		}},
		{"a holder cut off from the ledger past its deadline, then taken over", func() bundle {
			a := newOp("a", done(`1`))
			l := newLeaseLog()
			l.cutOff[holderKey{"w1.1", a.key}] = at(4000)
			l.takeover[a.key] = at(7000)
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 7000, 200, "w2.1", 2)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}, kill("w3.1", 3000)}, leases: l}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK, "an outage repeat, not allowed unless asked")
			require.Equal(t, 1, v.RepeatsOutage, "the holder was alive: not the crash window, and not a lease lost to its own write")
			require.Zero(t, v.RepeatsPhantom)
			require.Zero(t, v.RepeatsCrash)
		}},
		{"another holder's cut-off line explains nothing", func() bundle {
			a := newOp("a", done(`1`))
			l := newLeaseLog()
			l.cutOff[holderKey{"w3.1", a.key}] = at(2000)
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hitBy(a, 7000, 200, "w2.1", 2)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}}, leases: l}
		}, func(t *testing.T, v *Verdict) {
			require.Equal(t, 1, v.RepeatsUnexplain)
			require.Zero(t, v.RepeatsOutage)
		}},
		{"fired twice with another key", func() bundle {
			a := newOp("a", done(`1`))
			other := hitBy(a, 3000, 200, "w2.1", 2)
			other.Key = "chaos_op.other"
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), other},
				events: []event{kill("w1.1", 50)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsOtherKey)
			require.Equal(t, 1, v.KeyMismatches)
		}},
		{"a request without holder or attempt", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hitBy(a, 0, 200, "", 0)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.Unattributed)
		}},
		{"disagreeing answers", func() bundle {
			a := newOp("a", done(`{"n":1}`), done(`{"n":2}`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.DisagreeingAnswers)
		}},
		{"unexpected conflict", func() bundle {
			a := newOp("a", done(`1`), copyOut{Published: true, Via: "reply", Status: intent.StatusConflict, Code: intent.CodeConflict})
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.UnexpectedAnswers["conflict/conflict"])
		}},
		{"failed without firing is not lost", func() bundle {
			a := newOp("a", copyOut{Published: true, Via: "answer", Status: intent.StatusFailed, Code: intent.CodeEffectFailed})
			return bundle{ops: []*op{a}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Zero(t, v.LostOperations)
			require.Equal(t, 1, v.NeverFired)
			require.Equal(t, 1, v.UnexpectedAnswers["failed/effect_failed"])
		}},
		{"request of no operation", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), {Key: "x", Status: 200, Holder: "w1.1", Attempt: 1, op: "zzz"}}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.ForeignRequests)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := c.build()
			if b.leases.lost == nil {
				b.leases = newLeaseLog()
			}
			v := &Verdict{}
			judge(v, runFacts{ops: b.ops, reqs: b.reqs, events: b.events, leases: b.leases, concurrency: 64})
			c.check(t, v)
		})
	}
}

func TestParseSinkLog(t *testing.T) {
	t.Parallel()
	reqs, err := parseSinkLog(strings.NewReader(
		`{"time":"2026-01-02T03:04:05Z","received":"2026-01-02T03:04:04Z","key":"k","tool":"chaos_op","holder":"w2.3","attempt":2,"status":200,"hung":true,"payload":{"op":"op-1","n":1}}` + "\n" +
			`{"time":"2026-01-02T03:04:06Z","key":"k","status":503}` + "\n"))
	require.NoError(t, err)
	require.Len(t, reqs, 2)
	require.Equal(t, "op-1", reqs[0].op)
	require.True(t, reqs[0].ok())
	require.True(t, reqs[0].Hung)
	require.Equal(t, "w2.3", reqs[0].Holder)
	require.Equal(t, 2, reqs[0].Attempt)
	require.Equal(t, "chaos_op", reqs[0].Tool)
	require.False(t, reqs[1].ok())

	_, err = parseSinkLog(strings.NewReader("not json\n"))
	require.Error(t, err)
}

func TestPlanHasEveryKindAndEnoughDuplicates(t *testing.T) {
	t.Parallel()
	cfg := config{intents: 5000, singleShare: 0.45}
	ops, err := plan(cfg, "s", newRand(1))
	require.NoError(t, err)
	kinds := map[string]int{}
	copies := 0
	keys := map[string]bool{}
	for _, o := range ops {
		kinds[o.kind]++
		copies += len(o.copies)
		require.False(t, keys[o.key], "one key per operation")
		keys[o.key] = true
	}
	require.GreaterOrEqual(t, copies, cfg.intents)
	for _, k := range append([]string{kindSingle}, dupKinds...) {
		require.Positive(t, kinds[k], k)
	}
	require.GreaterOrEqual(t, float64(copies-len(ops))/float64(copies), 0.30)
}
