package intent

import "fmt"

// Build returns the envelope of a call assembled from its parts (by a front
// door, or a client about to publish), checked as Decode checks a received
// envelope: env.Tool valid, a key override of 1 to MaxKeyBytes bytes when
// set, valid UTF-8 and no control character in Session and CallID, CreatedAt within RFC
// 3339's years; env.Args one strict JSON object (see Canonicalize), any
// whitespace and member order (nil or blank: {}), nested no deeper than
// lim.MaxDepth counting the envelope. The args are parsed once: the
// result's Args are their canonical form, its Data the envelope's encoding
// (the bytes to publish), and its Derive and CheckKeyArgs use the parsed
// args. Errors: ErrTooLarge when Data is over lim.MaxBytes; otherwise they
// wrap ErrInvalid (a *SyntaxError, its offset in env.Args, for args that are
// not strict JSON).
func Build(env Envelope, lim Limits) (Decoded, error) {
	lim = lim.withDefaults()
	if !ValidTool(env.Tool) {
		return Decoded{}, invalidf("field \"tool\": %q must match [a-z0-9_-]{1,64}", clip(env.Tool))
	}
	if env.Key != "" {
		if err := checkKeyOverride(env.Key); err != nil {
			return Decoded{}, err
		}
	}
	if err := checkUTF8(&env); err != nil {
		return Decoded{}, err
	}
	if err := CheckHeaderText("session", env.Session); err != nil {
		return Decoded{}, err
	}
	if err := CheckHeaderText("call_id", env.CallID); err != nil {
		return Decoded{}, err
	}
	raw := []byte(env.Args)
	if len(trimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	args, err := parseJSONAt(raw, lim.MaxDepth, 1)
	if err != nil {
		return Decoded{}, err
	}
	if args.kind != kindObject {
		return Decoded{}, invalidf("args (the tool's arguments) must be a JSON object, not %s", args.kind)
	}
	env.Args = appendCanonical(nil, &args)
	data, err := env.MarshalJSON()
	if err != nil {
		return Decoded{}, err
	}
	if len(data) > lim.MaxBytes {
		return Decoded{}, fmt.Errorf("%w: the intent is %d bytes, the limit is %d", ErrTooLarge, len(data), lim.MaxBytes)
	}
	return Decoded{Envelope: &env, canonArgs: env.Args, args: &args, data: data}, nil
}

// CheckKeyArgs returns an error wrapping ErrInvalid when the intent's key
// cannot name its operation: its tool is of class (ClassUnsafe) and derives
// keys from key args (spec.KeyArgs), one of them is missing from the args,
// and the envelope has no key override. Keyed by the args it has, two
// operations would share one key. The front doors apply this rule before
// they publish, and the workers before they claim.
func (d Decoded) CheckKeyArgs(class Class, spec KeySpec) error {
	required := RequiredKeyArgs(class, spec)
	if d.Key != "" || len(required) == 0 {
		return nil
	}
	args := d.parsed()
	if args == nil {
		v, err := checkEnvelope(d.Envelope, nil, KeySpec{})
		if err != nil {
			return err
		}
		args = &v
	}
	for _, k := range required {
		if !args.has(k) {
			return invalidf("tool %s is unsafe and its key arg %q is missing: give it, or a key override naming the operation (the envelope's key; over HTTP the Idempotency-Key header)", d.Tool, k)
		}
	}
	return nil
}

// RequiredKeyArgs are the args an intent of a tool of class with key spec
// must carry unless it has a key override (CheckKeyArgs): the key args of
// an unsafe tool, none for another class. A tool's published input schema
// names them as required.
func RequiredKeyArgs(class Class, spec KeySpec) []string {
	if class != ClassUnsafe {
		return nil
	}
	return spec.KeyArgs
}

// has reports whether the object o has a member name.
func (o *value) has(name string) bool {
	for i := range o.members {
		if o.members[i].name == name {
			return true
		}
	}
	return false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
