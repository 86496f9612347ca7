package dedup

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The record's encoder writes what encoding/json writes for it, byte for
// byte, for every combination of set and unset fields and for strings that
// need escaping; its raw JSON is copied as it is (encoding/json compacts
// it), and invalid raw JSON is refused as encoding/json refuses it.
func TestRecordEncodingIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	strs := []string{"", "plain", `quote " and \ back`, "ctl \x00\x01\b\f\n\r\t\x1f", "<html> & co", "ünïcødé ☃ 𝄞",
		"line\u2028para\u2029", "bad \xff utf8 \xc3", strings.Repeat("x", 300)}
	times := []time.Time{{}, time.Date(2026, 12, 1, 13, 4, 5, 123456789, time.UTC), time.Date(1, 1, 1, 0, 0, 0, 1, time.FixedZone("x", 3600))}
	raws := []json.RawMessage{nil, json.RawMessage(`{"ok":true,"n":[1,2.5,-3e7],"s":"a\u00e9"}`), json.RawMessage(`"str"`), json.RawMessage(`null`)}
	receipts := []json.RawMessage{nil, json.RawMessage(`{"kind":"outcome","sig":"c2ln"}`)}
	pick := func(n int) int { return rng.IntN(n) }
	for i := range 2000 {
		r := Record{
			Status: intent.Status(strs[pick(len(strs))]), Tool: strs[pick(len(strs))], Session: strs[pick(len(strs))], Fingerprint: strs[pick(len(strs))],
			Holder: strs[pick(len(strs))], LeaseUntil: times[pick(len(times))], Attempt: rng.IntN(5) - 1, Attempts: rng.IntN(1 << 20),
			Result: raws[pick(len(raws))], IntentSeq: rng.Uint64() >> uint(pick(64)), CallID: strs[pick(len(strs))],
			Intent: raws[pick(len(raws))], CreatedAt: times[pick(len(times))], UpdatedAt: times[pick(len(times))],
			CompletedAt: times[pick(len(times))], Receipt: receipts[pick(len(receipts))],
		}
		for range pick(3) {
			r.Submissions = append(r.Submissions, strs[pick(len(strs))])
		}
		if pick(2) == 0 {
			r.Error = &intent.Error{Code: strs[pick(len(strs))], Message: strs[pick(len(strs))]}
		}
		if pick(2) == 0 {
			r.Decision = &Decision{Op: strs[pick(len(strs))], By: strs[pick(len(strs))], Reason: strs[pick(len(strs))],
				At: times[pick(len(times))], Until: times[pick(len(times))]}
		}
		if pick(2) == 0 {
			r.Probe = &Probe{At: times[pick(len(times))], Key: strs[pick(len(strs))], Verdict: strs[pick(len(strs))], Request: strs[pick(len(strs))],
				Status: strs[pick(len(strs))], Body: strs[pick(len(strs))]}
		}
		if pick(3) == 0 {
			// Stored in place of the receipt.
			r.Receipt, r.Signature = nil, &Signature{Key: strs[pick(len(strs))], Holder: strs[pick(len(strs))], Signer: strs[pick(len(strs))],
				Sig: strs[pick(len(strs))], Proof: strs[pick(len(strs))]}
		}
		want, err := json.Marshal(r)
		require.NoError(t, err)
		got, err := r.marshal()
		require.NoError(t, err)
		require.Equalf(t, string(want), string(got), "record %d", i)
		if r.Signature != nil {
			r.Receipt = receipts[1]
			both, err := r.marshal()
			require.NoError(t, err)
			require.Equal(t, string(got), string(both), "the receipt is left out beside its signature")
		}
	}

	// Raw JSON as it is: encoding/json would compact the spaces away.
	r := Record{Status: intent.StatusCompleted, Result: json.RawMessage(`{ "a" : [ 1 , 2 ] }`)}
	got, err := r.marshal()
	require.NoError(t, err)
	require.Contains(t, string(got), `"result":{ "a" : [ 1 , 2 ] }`)
	back, err := decodeRecord(got)
	require.NoError(t, err)
	require.JSONEq(t, `{"a":[1,2]}`, string(back.Result))

	for _, bad := range []string{`{"a":`, `nope`, `{"a":1}x`} {
		_, jerr := json.Marshal(Record{Result: json.RawMessage(bad)})
		require.Error(t, jerr)
		_, err := Record{Result: json.RawMessage(bad)}.marshal()
		require.Errorf(t, err, "raw %q", bad)
		_, err = Record{Intent: json.RawMessage(bad)}.marshal()
		require.Errorf(t, err, "raw %q", bad)
	}
	_, err = Record{CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}.marshal()
	require.Error(t, err, "a year past 9999, as encoding/json")
}

// Every field of Record (and of Decision) set at once encodes as
// encoding/json encodes it: a field added to Record without its encoder
// fails here. A record with a Signature stores it in place of its
// Receipt, which is encoded when it has none.
func TestRecordEncodingHasEveryField(t *testing.T) {
	t.Parallel()
	var r Record
	fillEvery(reflect.ValueOf(&r).Elem())
	for range 2 {
		check := r
		if check.Signature != nil {
			check.Receipt = nil
		}
		want, err := json.Marshal(check)
		require.NoError(t, err)
		got, err := r.marshal()
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
		r.Signature = nil
	}
}

// fillEvery sets every field of v, recursively, to a value that no
// omitempty or omitzero option omits.
func fillEvery(v reflect.Value) {
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 12, 1, 13, 4, 5, 6, time.UTC)))
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		v.Set(reflect.ValueOf(json.RawMessage(`{"x":1}`)))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.Type().Name() + "-value")
	case reflect.Int, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint64:
		v.SetUint(9)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillEvery(p.Elem())
		v.Set(p)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillEvery(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[[]string]() {
			v.Set(reflect.ValueOf([]string{"first", "second"}))
		}
		if v.Len() == 0 {
			panic("fillEvery: no value for " + v.Type().String())
		}
	default:
		panic("fillEvery: no value for " + v.Type().String())
	}
}

// A record's leading status, read without decoding it, is the status it
// decodes to, for every status as this package and encoding/json write
// it; anything else is left to the decoder.
func TestLeadingStatus(t *testing.T) {
	t.Parallel()
	for _, st := range []intent.Status{intent.StatusPending, intent.StatusCompleted, intent.StatusFailed, intent.StatusDenied,
		intent.StatusAwaitingApproval, intent.StatusApproved, intent.StatusUncertain, intent.StatusForgotten} {
		r := Record{Status: st, Tool: "t", Fingerprint: "fp", Result: json.RawMessage(`{"status":"x"}`)}
		ours, err := r.marshal()
		require.NoError(t, err)
		std, err := json.Marshal(r)
		require.NoError(t, err)
		for _, data := range [][]byte{ours, std} {
			got, ok := leadingStatus(data)
			require.True(t, ok, string(data))
			dec, err := decodeRecord(data)
			require.NoError(t, err)
			require.Equal(t, dec.Status, got, string(data))
		}
	}
	for _, data := range []string{``, `{}`, `{"tool":"t","status":"completed"}`, `{ "status":"completed"}`,
		`{"status":"completed`, `{"status":"completed"`, `{"status":"compl\"eted","x":1}`, `{"status":"completed"x}`} {
		_, ok := leadingStatus([]byte(data))
		require.False(t, ok, data)
	}
	st, ok := leadingStatus([]byte(`{"status":"completed"}`))
	require.True(t, ok)
	require.Equal(t, intent.StatusCompleted, st)
}
