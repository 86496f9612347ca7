package intent

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// update rewrites testdata/vectors.json and testdata/invalid.json (which
// docs/protocol.md section 10 links) from vectorCases and invalidCases:
//
//	go test ./pkg/intent -run Vectors -update
//
// Review the diff: a vector whose key moves breaks every deployed client.
var update = flag.Bool("update", false, "rewrite the test vectors from the cases in vectors_test.go")

const (
	vectorsFile  = "testdata/vectors.json"
	invalidFile  = "testdata/invalid.json"
	protocolFile = "../../docs/protocol.md"
)

// vector is one entry of testdata/vectors.json.
type vector struct {
	Name     string     `json:"name"`
	Envelope string     `json:"envelope"`
	Spec     vectorSpec `json:"spec"`
	MsgTime  string     `json:"msg_time"`
	Material string     `json:"material"`
	Key      string     `json:"key"`
	Finger   string     `json:"fingerprint"`
	// Partition is the key's ledger partition (Partition) in ledgers of 2,
	// 8, 64 and 256 partitions.
	Partition vectorPartitions `json:"partition"`
	// LedgerKey is the KV key under which a ledger of layout 1 and of
	// layout 2 stores the key (LedgerKey).
	LedgerKey vectorLedgerKeys `json:"ledger_key"`
}

type vectorLedgerKeys struct {
	Full    string `json:"1"`
	Compact string `json:"2"`
}

func ledgerKeysOf(t *testing.T, key string) vectorLedgerKeys {
	t.Helper()
	full, err := LedgerKey(key, LayoutFull)
	require.NoError(t, err)
	compact, err := LedgerKey(key, LayoutCompact)
	require.NoError(t, err)
	return vectorLedgerKeys{Full: full, Compact: compact}
}

type vectorPartitions struct {
	Of2   int `json:"2"`
	Of8   int `json:"8"`
	Of64  int `json:"64"`
	Of256 int `json:"256"`
}

func partitionsOf(key string) vectorPartitions {
	return vectorPartitions{Of2: Partition(key, 2), Of8: Partition(key, 8), Of64: Partition(key, 64), Of256: Partition(key, 256)}
}

type vectorSpec struct {
	KeyArgs       []string `json:"key_args"`
	WindowSeconds int64    `json:"window_seconds"`
	VolatileArgs  []string `json:"volatile_args"`
}

func (s vectorSpec) keySpec() KeySpec {
	return KeySpec{KeyArgs: s.KeyArgs, Window: time.Duration(s.WindowSeconds) * time.Second, VolatileArgs: s.VolatileArgs}
}

// invalidVector is one entry of testdata/invalid.json: an envelope every
// implementation must reject, with the error code of the answer.
type invalidVector struct {
	Name     string `json:"name"`
	Envelope string `json:"envelope"`
	Code     string `json:"code"`
}

var (
	noSpec   = vectorSpec{KeyArgs: []string{}, VolatileArgs: []string{}}
	weekSpec = vectorSpec{KeyArgs: []string{}, WindowSeconds: 604800, VolatileArgs: []string{}}
	cardSpec = vectorSpec{KeyArgs: []string{"customer", "amount_cents", "currency", "order"}, VolatileArgs: []string{}}
	shipSpec = vectorSpec{KeyArgs: []string{"order_id"}, VolatileArgs: []string{"requested_at"}}
	tickSpec = vectorSpec{KeyArgs: []string{}, VolatileArgs: []string{"requested_at"}}
)

// vectorCases are the inputs of testdata/vectors.json.
var vectorCases = []vector{
	{Name: "basic", Envelope: `{"tool":"send_email","args":{"to":"ada@example.com","subject":"Welcome"},"session":"run-7"}`, Spec: noSpec},
	{Name: "basic, other member order and whitespace (same key as basic)", Envelope: "{ \"session\" : \"run-7\",\n  \"args\": { \"subject\": \"Welcome\", \"to\": \"ada@example.com\" },\n  \"tool\": \"send_email\" }", Spec: noSpec},
	{Name: "basic with a call_id (same key and fingerprint as basic)", Envelope: `{"tool":"send_email","args":{"to":"ada@example.com","subject":"Welcome"},"session":"run-7","call_id":"call_9f2"}`, Spec: noSpec},
	{Name: "basic in another session (other key)", Envelope: `{"tool":"send_email","args":{"to":"ada@example.com","subject":"Welcome"},"session":"run-8"}`, Spec: noSpec},
	{Name: "no session", Envelope: `{"tool":"noop","args":{}}`, Spec: noSpec},
	{Name: "empty session (same key as no session)", Envelope: `{"tool":"noop","args":{},"session":""}`, Spec: noSpec},
	{Name: "nested objects and arrays", Envelope: `{"tool":"create_ticket","args":{"ticket":{"title":"Disk full","labels":["ops","p1"],"meta":{"z":null,"a":true,"m":[{"b":2,"a":1}]}}}}`, Spec: noSpec},
	{Name: "unicode: non-BMP and UTF-16 member order", Envelope: `{"tool":"post_message","args":{"\ufb33":"dalet","\ud83d\ude00":"grinning","\u20ac":"euro","\u00f6":"o","text":"caf\u00e9 😀 \ud83d\ude00"}}`, Spec: noSpec},
	{Name: "string escapes", Envelope: `{"tool":"post_message","args":{"text":"line1\nline2\t\"quoted\" back\\slash \/ \u0001\u001f\u007f \u2028\u2029 \b\f\r"}}`, Spec: noSpec},
	{Name: "numbers", Envelope: `{"tool":"record_metric","args":{"one":1.0,"safe_max":9007199254740991,"safe_min":-9007199254740991,"edge":9007199254740992,"tiny":1e-7,"micro":0.000001,"neg_zero":-0,"tenth":0.1,"exp":1.5E+3,"frac":123.4560,"small":-2.5e-10}}`, Spec: noSpec},
	{Name: "numbers, other spellings (same key as numbers)", Envelope: `{"tool":"record_metric","args":{"one":1,"safe_max":9007199254740991.0,"safe_min":-9.007199254740991e15,"edge":9.007199254740992E15,"tiny":0.0000001,"micro":1e-6,"neg_zero":0,"tenth":1e-1,"exp":1500,"frac":123.456,"small":-25e-11}}`, Spec: noSpec},
	{Name: "key_args", Envelope: `{"tool":"charge_card","args":{"customer":"cus_42","amount_cents":1999,"currency":"eur","note":"thanks"},"session":"shop"}`, Spec: cardSpec},
	{Name: "key_args, other note (same key, other fingerprint: a conflict)", Envelope: `{"tool":"charge_card","args":{"customer":"cus_42","amount_cents":1999,"currency":"eur","note":"thank you"},"session":"shop"}`, Spec: cardSpec},
	{Name: "key_args with volatile args", Envelope: `{"tool":"ship_order","args":{"order_id":"o-1001","requested_at":"2025-01-06T10:00:00Z"}}`, Spec: shipSpec},
	{Name: "key_args with volatile args, other volatile value (same key and fingerprint)", Envelope: `{"tool":"ship_order","args":{"order_id":"o-1001","requested_at":"2025-01-06T10:05:00Z"}}`, Spec: shipSpec},
	{Name: "volatile args without key_args", Envelope: `{"tool":"create_ticket","args":{"title":"Disk full","requested_at":"2025-01-06T09:00:00Z"}}`, Spec: tickSpec},
	{Name: "volatile args without key_args, other volatile value (same key and fingerprint)", Envelope: `{"tool":"create_ticket","args":{"title":"Disk full","requested_at":"2025-01-06T09:05:00Z"}}`, Spec: tickSpec},
	{Name: "volatile args without key_args, other title (other key)", Envelope: `{"tool":"create_ticket","args":{"title":"Disk almost full","requested_at":"2025-01-06T09:00:00Z"}}`, Spec: tickSpec},
	{Name: "key override", Envelope: `{"tool":"send_email","args":{"to":"ada@example.com","subject":"Welcome"},"session":"run-7","key":"welcome-user-42"}`, Spec: noSpec},
	{Name: "key override, other args (same key, other fingerprint: a conflict)", Envelope: `{"tool":"send_email","args":{"to":"bob@example.com","subject":"Welcome"},"session":"run-7","key":"welcome-user-42"}`, Spec: noSpec},
	{Name: "key override on a window tool (no window in the material)", Envelope: `{"tool":"welcome_email","args":{"user":42},"key":"welcome-user-42","created_at":"2025-01-06T10:00:00Z"}`, Spec: weekSpec},
	{Name: "window", Envelope: `{"tool":"welcome_email","args":{"user":42},"created_at":"2025-01-06T10:00:00Z"}`, Spec: weekSpec},
	{Name: "window, later in the same window (same key)", Envelope: `{"tool":"welcome_email","args":{"user":42},"created_at":"2025-01-08T23:59:59Z"}`, Spec: weekSpec},
	{Name: "window, created_at with an offset (same key)", Envelope: `{"tool":"welcome_email","args":{"user":42},"created_at":"2025-01-09T01:30:00.25+02:00"}`, Spec: weekSpec},
	{Name: "window, message time when created_at is absent (same key)", Envelope: `{"tool":"welcome_email","args":{"user":42}}`, Spec: weekSpec, MsgTime: "2025-01-02T00:00:00Z"},
	{Name: "window, next window (other key)", Envelope: `{"tool":"welcome_email","args":{"user":42},"created_at":"2025-01-09T00:00:00Z"}`, Spec: weekSpec, MsgTime: "2025-01-06T10:00:00Z"},
}

// invalidCases are the inputs of testdata/invalid.json.
var invalidCases = []invalidVector{
	{Name: "repeated member name", Envelope: `{"tool":"noop","args":{"a":1,"a":1}}`},
	{Name: "repeated field", Envelope: `{"tool":"noop","tool":"noop","args":{}}`},
	{Name: "unknown field", Envelope: `{"tool":"noop","args":{},"sesion":"x"}`},
	{Name: "field name in another case", Envelope: `{"Tool":"noop","args":{}}`},
	{Name: "missing tool", Envelope: `{"args":{}}`},
	{Name: "invalid tool name", Envelope: `{"tool":"Send.Email","args":{}}`},
	{Name: "missing args", Envelope: `{"tool":"noop"}`},
	{Name: "null args", Envelope: `{"tool":"noop","args":null}`},
	{Name: "array args", Envelope: `{"tool":"noop","args":[]}`},
	{Name: "null session", Envelope: `{"tool":"noop","args":{},"session":null}`},
	{Name: "empty key override", Envelope: `{"tool":"noop","args":{},"key":""}`},
	{Name: "key override over 256 bytes", Envelope: `{"tool":"noop","args":{},"key":"` + string(bytes.Repeat([]byte("k"), 257)) + `"}`},
	{Name: "created_at not RFC 3339", Envelope: `{"tool":"noop","args":{},"created_at":"2025-01-06 10:00:00"}`},
	{Name: "lone high surrogate", Envelope: `{"tool":"noop","args":{"s":"\ud83d"}}`},
	{Name: "lone low surrogate", Envelope: `{"tool":"noop","args":{"s":"\ude00x"}}`},
	{Name: "integer beyond 2^53", Envelope: `{"tool":"noop","args":{"id":9007199254740993}}`},
	{Name: "large number beyond 2^53", Envelope: `{"tool":"noop","args":{"n":1e21}}`},
	{Name: "number beyond float64", Envelope: `{"tool":"noop","args":{"n":1e400}}`},
	{Name: "trailing data", Envelope: `{"tool":"noop","args":{}} {}`},
	{Name: "not an object", Envelope: `"noop"`},
	{Name: "line break in session", Envelope: `{"tool":"noop","args":{},"session":"run-7\nX-Injected: 1"}`},
	{Name: "NUL in call_id", Envelope: `{"tool":"noop","args":{},"call_id":"call\u0000"}`},
	{Name: "C1 control in session", Envelope: `{"tool":"noop","args":{},"session":"run\u0085"}`},
}

// derived fills the outputs of a vector from its inputs.
func derived(t *testing.T, v vector) vector {
	t.Helper()
	env, err := Decode([]byte(v.Envelope), Limits{})
	require.NoError(t, err, v.Name)
	var msgTime time.Time
	if v.MsgTime != "" {
		msgTime, err = time.Parse(time.RFC3339, v.MsgTime)
		require.NoError(t, err, v.Name)
	}
	material, err := Material(env, v.Spec.keySpec(), msgTime)
	require.NoError(t, err, v.Name)
	id, err := Derive(env, v.Spec.keySpec(), msgTime)
	require.NoError(t, err, v.Name)
	v.Material, v.Key, v.Finger = string(material), id.Key, id.Fingerprint
	v.Partition = partitionsOf(id.Key)
	v.LedgerKey = ledgerKeysOf(t, id.Key)
	return v
}

// encodeVectors is the byte layout of the vector files: two-space indent,
// no HTML escaping, a final newline.
func encodeVectors(t *testing.T, vs any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(vs))
	return buf.Bytes()
}

func TestVectors(t *testing.T) {
	if *update {
		var out []vector
		for _, c := range vectorCases {
			out = append(out, derived(t, c))
		}
		for i := range invalidCases {
			_, err := Decode([]byte(invalidCases[i].Envelope), Limits{})
			require.Error(t, err, invalidCases[i].Name)
			invalidCases[i].Code = Code(err)
		}
		require.NoError(t, os.WriteFile(vectorsFile, encodeVectors(t, out), 0o644))
		require.NoError(t, os.WriteFile(invalidFile, encodeVectors(t, invalidCases), 0o644))
	}

	data, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var vs []vector
	require.NoError(t, json.Unmarshal(data, &vs))
	require.GreaterOrEqual(t, len(vs), 10)
	byName := map[string]vector{}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			got := derived(t, v)
			require.Equal(t, v.Material, got.Material, "material")
			require.Equal(t, v.Key, got.Key, "key")
			require.Equal(t, v.Finger, got.Finger, "fingerprint")
			require.Equal(t, v.Partition, got.Partition, "partition")
			require.Equal(t, v.LedgerKey, got.LedgerKey, "ledger key")
		})
		byName[v.Name] = v
	}
	// The file is the cases, byte for byte: no hand edits drift from them.
	require.Len(t, vs, len(vectorCases))
	for i, c := range vectorCases {
		require.Equal(t, c.Name, vs[i].Name)
		require.Equal(t, c.Envelope, vs[i].Envelope, c.Name)
		require.Equal(t, c.Spec, vs[i].Spec, c.Name)
		require.Equal(t, c.MsgTime, vs[i].MsgTime, c.Name)
	}
	require.Equal(t, string(encodeVectors(t, vs)), string(data), "layout of %s", vectorsFile)

	// What the vectors are for: these must hold whatever the hashes are.
	same := func(field string, a, b string) {
		t.Helper()
		va, vb := byName[a], byName[b]
		require.NotEmpty(t, va.Name, a)
		require.NotEmpty(t, vb.Name, b)
		if field == "key" {
			require.Equal(t, va.Key, vb.Key, "%q and %q", a, b)
		} else {
			require.Equal(t, va.Finger, vb.Finger, "%q and %q", a, b)
		}
	}
	differ := func(field string, a, b string) {
		t.Helper()
		va, vb := byName[a], byName[b]
		require.NotEmpty(t, va.Name, a)
		require.NotEmpty(t, vb.Name, b)
		if field == "key" {
			require.NotEqual(t, va.Key, vb.Key, "%q and %q", a, b)
		} else {
			require.NotEqual(t, va.Finger, vb.Finger, "%q and %q", a, b)
		}
	}
	same("key", "basic", "basic, other member order and whitespace (same key as basic)")
	same("fingerprint", "basic", "basic, other member order and whitespace (same key as basic)")
	same("key", "basic", "basic with a call_id (same key and fingerprint as basic)")
	same("fingerprint", "basic", "basic with a call_id (same key and fingerprint as basic)")
	differ("key", "basic", "basic in another session (other key)")
	same("key", "no session", "empty session (same key as no session)")
	same("key", "numbers", "numbers, other spellings (same key as numbers)")
	same("key", "key_args", "key_args, other note (same key, other fingerprint: a conflict)")
	differ("fingerprint", "key_args", "key_args, other note (same key, other fingerprint: a conflict)")
	same("key", "key_args with volatile args", "key_args with volatile args, other volatile value (same key and fingerprint)")
	same("fingerprint", "key_args with volatile args", "key_args with volatile args, other volatile value (same key and fingerprint)")
	same("key", "volatile args without key_args", "volatile args without key_args, other volatile value (same key and fingerprint)")
	same("fingerprint", "volatile args without key_args", "volatile args without key_args, other volatile value (same key and fingerprint)")
	differ("key", "volatile args without key_args", "volatile args without key_args, other title (other key)")
	differ("key", "basic", "key override")
	same("fingerprint", "basic", "key override")
	same("key", "key override", "key override, other args (same key, other fingerprint: a conflict)")
	differ("fingerprint", "key override", "key override, other args (same key, other fingerprint: a conflict)")
	for _, n := range []string{
		"window, later in the same window (same key)",
		"window, created_at with an offset (same key)",
		"window, message time when created_at is absent (same key)",
	} {
		same("key", "window", n)
	}
	differ("key", "window", "window, next window (other key)")
	same("fingerprint", "window", "window, next window (other key)")
}

func TestInvalidVectors(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(invalidFile)
	require.NoError(t, err)
	var vs []invalidVector
	require.NoError(t, json.Unmarshal(data, &vs))
	require.Len(t, vs, len(invalidCases))
	for i, v := range vs {
		require.Equal(t, invalidCases[i].Name, v.Name)
		require.Equal(t, invalidCases[i].Envelope, v.Envelope)
		_, err := Decode([]byte(v.Envelope), Limits{})
		require.Error(t, err, v.Name)
		require.Equal(t, v.Code, Code(err), v.Name)
	}
	require.Equal(t, string(encodeVectors(t, vs)), string(data))
}

// TestProtocolDocVectors checks that docs/protocol.md links the vector
// files it describes.
func TestProtocolDocVectors(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(protocolFile)
	require.NoError(t, err)
	for _, f := range []string{vectorsFile, invalidFile} {
		link := "(../pkg/intent/" + f + ")"
		require.True(t, bytes.Contains(doc, []byte(link)), "docs/protocol.md does not link %s as %s", f, link)
		_, err := os.Stat(f)
		require.NoError(t, err)
	}
}
