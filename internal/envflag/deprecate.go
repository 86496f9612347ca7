package envflag

import (
	"flag"
	"fmt"
)

// Deprecate registers old as a deprecated name of the flag name, kept for one
// release: old set on the command line, as its environment variable
// (Name(prefix, old)) or in a config file sets name, and Apply or ApplyFile
// prints one warning naming the new flag to fs.Output(). The new name wins
// over the old one from the same source (command line, environment, file);
// a source of higher precedence wins as for any flag. --help lists old as
// deprecated. name must be registered first.
func Deprecate(fs *flag.FlagSet, old, name string) {
	target := fs.Lookup(name)
	if target == nil {
		panic("envflag: Deprecate(" + old + "): no flag " + name)
	}
	fs.Var(&alias{fs: fs, name: name, bool: isBool(target)}, old,
		fmt.Sprintf("deprecated, removed in the next release: use --%s", name))
}

// Deprecated reports the flag f is a deprecated name of: the new flag's name,
// and whether f is one.
func Deprecated(f *flag.Flag) (name string, ok bool) {
	a, ok := f.Value.(*alias)
	if !ok {
		return "", false
	}
	return a.name, true
}

// alias is the value of a deprecated flag name: it sets the flag it stands
// for, so that flag counts as given (flag.FlagSet.Visit).
type alias struct {
	fs   *flag.FlagSet
	name string
	bool bool
}

func (a *alias) String() string { return "" }

func (a *alias) Set(v string) error {
	if a == nil || a.fs == nil {
		return nil
	}
	return a.fs.Set(a.name, v)
}

// IsBoolFlag lets a deprecated name of a boolean flag stand alone (--old).
func (a *alias) IsBoolFlag() bool { return a != nil && a.bool }

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// warnDeprecated prints the warning for a deprecated name used: old, and
// the name to use instead.
func warnDeprecated(fs *flag.FlagSet, old, name string) {
	fmt.Fprintf(fs.Output(), "warning: %s is deprecated and goes in the next release: use %s\n", old, name)
}
