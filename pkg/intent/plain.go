package intent

// PlainArgs returns the args as encoding/json decodes a JSON object into a
// map[string]any — objects map[string]any, arrays []any, numbers float64,
// strings, booleans, nil — which is what a JSON Schema validator reads. The
// args as parsed are converted, not parsed again; args changed since
// decoding (or an envelope built by hand) are parsed and checked now, and
// an error then wraps ErrInvalid.
func (d Decoded) PlainArgs() (map[string]any, error) {
	args := d.parsed()
	if args == nil {
		v, err := checkEnvelope(d.Envelope, nil, KeySpec{})
		if err != nil {
			return nil, err
		}
		args = &v
	}
	return plainObject(args), nil
}

// plainObject is the object o as plain Go values (see PlainArgs).
func plainObject(o *value) map[string]any {
	m := make(map[string]any, len(o.members))
	for i := range o.members {
		m[o.members[i].name] = plain(&o.members[i].val)
	}
	return m
}

// plain is v as plain Go values (see PlainArgs).
func plain(v *value) any {
	switch v.kind {
	case kindBool:
		return v.boolean
	case kindNumber:
		return v.number
	case kindString:
		return v.str
	case kindArray:
		a := make([]any, len(v.array))
		for i := range v.array {
			a[i] = plain(&v.array[i])
		}
		return a
	case kindObject:
		return plainObject(v)
	}
	return nil // kindNull; kindRaw never holds parsed args
}
