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
		return &op{id: id, kind: kindConcurrent, key: "chaos_op." + id, fp: "fp-" + id, copies: copies}
	}
	hit := func(o *op, ms, status int) request {
		return request{Time: at(ms + 10), Arrived: at(ms), Key: o.key, Status: status, op: o.id}
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
		}},
		{"lost operation", func() bundle {
			a := newOp("a", copyOut{Published: true})
			return bundle{ops: []*op{a}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.LostOperations)
			require.Equal(t, 1, v.Unanswered)
		}},
		{"completed but never fired", func() bundle {
			return bundle{ops: []*op{newOp("a", done(`1`))}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.CompletedNotFired)
		}},
		{"fired twice with no fault", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hit(a, 3000, 200)}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsUnexplain)
		}},
		{"fired twice across a worker kill", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hit(a, 3000, 200)},
				events: []event{{Kind: faultWorkerKill, At: at(50), Until: at(60)}}}
		}, func(t *testing.T, v *Verdict) {
			require.True(t, v.OK, v.Violations)
			require.Equal(t, 1, v.RepeatsCrash)
			require.Equal(t, 1, v.ExtraFirings)
		}},
		{"a kill does not explain a repeat whose holder lived", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hit(a, 3000, 200)},
				events: []event{{Kind: faultWorkerKill, At: at(50), Until: at(60)}}, leases: lostAfterTakeover(a.key, at(3000))}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsUnexplain)
		}},
		{"fired twice across a JetStream outage", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hit(a, 3000, 200)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}}, leases: lostAfterTakeover(a.key, at(3000))}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK, "not allowed unless asked")
			require.Equal(t, 1, v.RepeatsOutage)
		}},
		{"a holder that failed before an outage and retried after losing its lease", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 503), hit(a, 3000, 200), hit(a, 3100, 200)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}}, leases: lostAfterTakeover(a.key, at(3000))}
		}, func(t *testing.T, v *Verdict) {
			require.Equal(t, 1, v.RepeatsOutage)
			require.Zero(t, v.RepeatsUnexplain)
		}},
		{"a holder told its lease was lost before anyone took over", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hit(a, 7000, 200)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}},
				leases: leaseLog{lost: map[string]time.Time{a.key: at(4000)}, takeover: map[string]time.Time{a.key: at(7000)}}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsPhantom)
			require.Zero(t, v.RepeatsOutage)
		}},
		{"a holder cut off from the ledger past its deadline, then taken over", func() bundle {
			a := newOp("a", done(`1`))
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), hit(a, 7000, 200)},
				events: []event{{Kind: faultJetStream, At: at(100), Until: at(2500)}, {Kind: faultWorkerKill, At: at(3000)}},
				leases: leaseLog{lost: map[string]time.Time{}, cutOff: map[string]time.Time{a.key: at(4000)}, takeover: map[string]time.Time{a.key: at(7000)}}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK, "an outage repeat, not allowed unless asked")
			require.Equal(t, 1, v.RepeatsOutage, "the holder was alive: not the crash window, and not a lease lost to its own write")
			require.Zero(t, v.RepeatsPhantom)
			require.Zero(t, v.RepeatsCrash)
		}},
		{"fired twice with another key", func() bundle {
			a := newOp("a", done(`1`))
			other := hit(a, 3000, 200)
			other.Key = "chaos_op.other"
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), other},
				events: []event{{Kind: faultWorkerKill, At: at(50)}}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.RepeatsOtherKey)
			require.Equal(t, 1, v.KeyMismatches)
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
			return bundle{ops: []*op{a}, reqs: []request{hit(a, 0, 200), {Key: "x", Status: 200, op: "zzz"}}}
		}, func(t *testing.T, v *Verdict) {
			require.False(t, v.OK)
			require.Equal(t, 1, v.ForeignRequests)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := c.build()
			v := &Verdict{}
			if b.leases.lost == nil {
				b.leases = leaseLog{lost: map[string]time.Time{}, cutOff: map[string]time.Time{}, takeover: map[string]time.Time{}}
			}
			judge(v, b.ops, b.reqs, b.events, b.leases, false)
			c.check(t, v)
		})
	}
}

func TestParseSinkLog(t *testing.T) {
	t.Parallel()
	reqs, err := parseSinkLog(strings.NewReader(
		`{"time":"2026-01-02T03:04:05Z","received":"2026-01-02T03:04:04Z","key":"k","status":200,"hung":true,"payload":{"op":"op-1","n":1}}` + "\n" +
			`{"time":"2026-01-02T03:04:06Z","key":"k","status":503}` + "\n"))
	require.NoError(t, err)
	require.Len(t, reqs, 2)
	require.Equal(t, "op-1", reqs[0].op)
	require.True(t, reqs[0].ok())
	require.True(t, reqs[0].Hung)
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

// lostAfterTakeover is a lease log where key was taken over at took and its
// first holder learnt it 50 ms later.
func lostAfterTakeover(key string, took time.Time) leaseLog {
	return leaseLog{lost: map[string]time.Time{key: took.Add(50 * time.Millisecond)}, takeover: map[string]time.Time{key: took}}
}
