package argschema

// Kept is how many schema texts s keeps.
func (s *Schemas) Kept() int {
	n := 0
	s.m.Range(func(any, any) bool { n++; return true })
	return n
}

const MaxSchemas = maxSchemas
