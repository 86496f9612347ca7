package intent

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The answer's encoder writes what encoding/json writes for it, byte for
// byte, except that its raw result is copied as it is.
func TestResultEncodingIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	strs := []string{"", "k.0123", `"q" \ b`, "\x00\x1f\b\f\n\r\t", "<&>", "é☃𝄞", "\u2028\u2029", "\xff\xfe", "a\xe2\x82"}
	times := []time.Time{{}, time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", -7200))}
	raws := []json.RawMessage{nil, json.RawMessage(`{"id":42,"tags":["a","b"],"deep":{"x":null}}`), json.RawMessage(`12.5`)}
	pick := func(n int) int { return rng.IntN(n) }
	for i := range 2000 {
		r := Result{Key: strs[pick(len(strs))], Tool: strs[pick(len(strs))], Status: Status(strs[pick(len(strs))]), Replayed: pick(2) == 0,
			Fingerprint: strs[pick(len(strs))], RecordFingerprint: strs[pick(len(strs))], Attempts: rng.IntN(100) - 10,
			IntentSeq: uint64(pick(3)) * (1<<53 - 1), Attempt: pick(3) - 1, Result: raws[pick(len(raws))], CallID: strs[pick(len(strs))], CompletedAt: times[pick(len(times))]}
		if pick(2) == 0 {
			r.Error = &Error{Code: strs[pick(len(strs))], Message: strs[pick(len(strs))]}
		}
		want, err := json.Marshal(r)
		require.NoError(t, err)
		got, err := r.AppendJSON(nil)
		require.NoError(t, err)
		require.Equalf(t, string(want), string(got), "answer %d", i)
	}
	_, err := Result{Result: json.RawMessage(`{"unterminated":`)}.AppendJSON(nil)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = Result{Receipt: json.RawMessage(`"not an object"`)}.AppendJSON(nil)
	require.ErrorIs(t, err, ErrInvalid)
}

// Every field of Result set at once encodes as encoding/json encodes it: a
// field added to Result without its encoder fails here.
func TestResultEncodingHasEveryField(t *testing.T) {
	t.Parallel()
	var r Result
	v := reflect.ValueOf(&r).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Interface().(type) {
		case string, Status:
			f.SetString("v")
		case bool:
			f.SetBool(true)
		case int:
			f.SetInt(3)
		case uint64:
			f.SetUint(7)
		case json.RawMessage:
			f.Set(reflect.ValueOf(json.RawMessage(`{"a":[1]}`)))
		case *Error:
			f.Set(reflect.ValueOf(&Error{Code: "c", Message: "m"}))
		case time.Time:
			f.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)))
		default:
			t.Fatalf("no value for Result.%s (%s): set it here and encode it in AppendJSON", v.Type().Field(i).Name, f.Type())
		}
	}
	want, err := json.Marshal(r)
	require.NoError(t, err)
	got, err := r.AppendJSON(nil)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}
