package intent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// materialVersion is the "v" member of every key material. A change to the
// derivation that moves any key gets a new version.
const materialVersion = 1

// Validate reports whether s can derive keys: Window must be zero or a
// whole number of seconds, at least one second. Errors wrap ErrInvalidSpec.
func (s KeySpec) Validate() error {
	switch {
	case s.Window < 0:
		return fmt.Errorf("%w: window %s is negative; use 0 for no window", ErrInvalidSpec, s.Window)
	case s.Window > 0 && (s.Window < time.Second || s.Window%time.Second != 0):
		return fmt.Errorf("%w: window %s is not a whole number of seconds (at least 1s)", ErrInvalidSpec, s.Window)
	}
	return nil
}

// Derive computes the key and fingerprint of env under the tool's spec.
//
// The key is env.Tool + "." + hex(sha256(Material(env, spec, msgTime))); the
// volatile args enter neither the key nor the fingerprint. The
// fingerprint is hex(sha256(JCS({"tool":T,"session":S,"args":A}))) where A is
// the whole args object minus spec.VolatileArgs; it does not depend on
// KeyArgs, the window or a key override.
//
// msgTime is the JetStream message timestamp: a window tool uses it when the
// envelope has no created_at (a client should set created_at, so that it can
// compute the same key before publishing). Derive checks a hand-built env as
// Decode would; errors wrap ErrInvalid, or ErrInvalidSpec for a bad spec.
func Derive(env *Envelope, spec KeySpec, msgTime time.Time) (Identity, error) {
	return derive(env, nil, spec, msgTime)
}

// Decoded is an envelope as Decode returned it, or as Build assembled it,
// with what that established: its args are parsed, checked and canonical,
// and its encoding is known. Its Derive and CheckKeyArgs take the args as
// they are instead of parsing them again, as Derive does for an envelope
// that may have been built by hand.
type Decoded struct {
	*Envelope
	canonArgs []byte // Args as decoded
	args      *value // the args as parsed
	data      []byte // the envelope as received or built
}

// DecodeEnvelope is Decode, keeping what the decoding established (see
// Decoded).
func DecodeEnvelope(data []byte, lim Limits) (Decoded, error) {
	env, args, err := decode(data, lim)
	if err != nil {
		return Decoded{}, err
	}
	return Decoded{Envelope: env, canonArgs: env.Args, args: args, data: data}, nil
}

// Data is the envelope's encoding: the bytes it was decoded from, or those
// Build wrote, which a client publishes.
func (d Decoded) Data() []byte { return d.data }

// Derive is Derive(d.Envelope, spec, msgTime): the same identity. Args
// changed since decoding are parsed and checked again.
func (d Decoded) Derive(spec KeySpec, msgTime time.Time) (Identity, error) {
	return derive(d.Envelope, d.parsed(), spec, msgTime)
}

// parsed returns the args as parsed, or nil when they changed since (or d
// is not a decoded envelope).
func (d Decoded) parsed() *value {
	if d.Envelope == nil || d.args == nil || !bytes.Equal(d.canonArgs, d.Args) {
		return nil
	}
	return d.args
}

// derive is Derive; parsed, when not nil, are env's args as Decode or
// Build left them (env.Args their canonical form).
func derive(env *Envelope, parsed *value, spec KeySpec, msgTime time.Time) (Identity, error) {
	args, err := checkEnvelope(env, parsed, spec)
	if err != nil {
		return Identity{}, err
	}
	material, err := buildMaterial(env, &args, spec, msgTime)
	if err != nil {
		return Identity{}, err
	}
	kept := without(&args, spec.VolatileArgs)
	fp := object(
		member{"tool", str(env.Tool)},
		member{"session", str(env.Session)},
		member{"args", kept},
	)
	// One buffer for both encodings: each is hashed before the next.
	buf := appendCanonical(make([]byte, 0, len(env.Args)+len(env.Tool)+len(env.Session)+len(env.Key)+96), &material)
	key := env.Tool + "." + digest(buf)
	return Identity{Key: key, Fingerprint: digest(appendCanonical(buf[:0], &fp))}, nil
}

// Material returns the key material of env under spec, in its RFC 8785
// canonical form: the exact bytes whose SHA-256 is the key's hex part.
//
//   - default: {"args":A,"session":S,"tool":T,"v":1}, A being the whole args
//     object, or only its members named in spec.KeyArgs when that is not
//     empty (a name the args lack is left out), minus the members named in
//     spec.VolatileArgs;
//   - window tool (spec.Window > 0): a "window" member is added, the integer
//     floor(unix_seconds(t) / window_seconds), t being env.CreatedAt when
//     set, else msgTime; with neither, Material fails;
//   - key override (env.Key set): {"key":K,"session":S,"tool":T,"v":1}. The
//     override names the operation fully: neither args nor window enter.
//
// S is "" when the envelope has no session.
func Material(env *Envelope, spec KeySpec, msgTime time.Time) ([]byte, error) {
	args, err := checkEnvelope(env, nil, spec)
	if err != nil {
		return nil, err
	}
	m, err := buildMaterial(env, &args, spec, msgTime)
	if err != nil {
		return nil, err
	}
	return appendCanonical(nil, &m), nil
}

// checkEnvelope applies Decode's rules to a possibly hand-built envelope and
// returns its parsed args: parsed, when not nil (the args as Decode or Build
// left them: parsed and checked already), else parsed now. When spec picks
// no members of parsed args, it returns their canonical bytes themselves
// (kindRaw), which need no encoding again.
func checkEnvelope(env *Envelope, parsed *value, spec KeySpec) (value, error) {
	if env == nil {
		return value{}, invalidf("no envelope")
	}
	if !ValidTool(env.Tool) {
		return value{}, invalidf("tool %q must match [a-z0-9_-]{1,64}", clip(env.Tool))
	}
	if env.Key != "" {
		if err := checkKeyOverride(env.Key); err != nil {
			return value{}, err
		}
	}
	if err := checkUTF8(env); err != nil {
		return value{}, err
	}
	if err := CheckHeaderText("session", env.Session); err != nil {
		return value{}, err
	}
	if err := CheckHeaderText("call_id", env.CallID); err != nil {
		return value{}, err
	}
	if parsed != nil {
		if len(spec.KeyArgs) == 0 && len(spec.VolatileArgs) == 0 {
			return value{kind: kindRaw, raw: env.Args}, nil
		}
		return *parsed, nil
	}
	raw := []byte(env.Args)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	args, err := parseJSON(raw, maxCanonicalDepth)
	if err != nil {
		return value{}, fmt.Errorf("args: %w", err)
	}
	if args.kind != kindObject {
		return value{}, invalidf("args must be an object, got %s", args.kind)
	}
	return args, nil
}

// checkUTF8 applies Decode's rule that every string is valid UTF-8 to the
// string fields of a possibly hand-built envelope: a string of invalid
// UTF-8 has no canonical form, nor its key a decoded intent's.
func checkUTF8(env *Envelope) error {
	for _, f := range [...]struct{ name, val string }{{"key", env.Key}, {"session", env.Session}, {"call_id", env.CallID}} {
		if !utf8.ValidString(f.val) {
			return invalidf("field %q is not valid UTF-8", f.name)
		}
	}
	return nil
}

func buildMaterial(env *Envelope, args *value, spec KeySpec, msgTime time.Time) (value, error) {
	if err := spec.Validate(); err != nil {
		return value{}, err
	}
	base := make([]member, 0, 4) // a window tool's fifth member grows it
	base = append(base,
		member{"v", num(materialVersion)},
		member{"tool", str(env.Tool)},
		member{"session", str(env.Session)},
	)
	if env.Key != "" {
		return value{kind: kindObject, members: append(base, member{"key", str(env.Key)})}, nil
	}
	a := *args
	if len(spec.KeyArgs) > 0 {
		a = only(args, spec.KeyArgs)
	}
	// A volatile arg is not part of the operation's identity: it leaves the
	// key material as it leaves the fingerprint.
	a = without(&a, spec.VolatileArgs)
	m := append(base, member{"args", a})
	if spec.Window > 0 {
		t := env.CreatedAt
		if t.IsZero() {
			t = msgTime
		}
		if t.IsZero() {
			return value{}, invalidf("tool %q is keyed by a %s window and the intent has no created_at or message time", env.Tool, spec.Window)
		}
		w := floorDiv(t.Unix(), int64(spec.Window/time.Second))
		if w > maxSafeInteger || w < -maxSafeInteger {
			return value{}, invalidf("window number %d is beyond ±2^53", w)
		}
		m = append(m, member{"window", num(float64(w))})
	}
	return value{kind: kindObject, members: m}, nil
}

// floorDiv is a / b rounded toward negative infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// only returns the members of the object o named in names.
func only(o *value, names []string) value {
	out := object()
	for _, m := range o.members {
		if slices.Contains(names, m.name) {
			out.members = append(out.members, m)
		}
	}
	return out
}

// without returns the object o minus the members named in names.
func without(o *value, names []string) value {
	if len(names) == 0 {
		return *o
	}
	out := object()
	for _, m := range o.members {
		if !slices.Contains(names, m.name) {
			out.members = append(out.members, m)
		}
	}
	return out
}

func object(ms ...member) value { return value{kind: kindObject, members: append([]member{}, ms...)} }
func str(s string) value        { return value{kind: kindString, str: s} }
func num(f float64) value       { return value{kind: kindNumber, number: f} }

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
