// Package envflag lets environment variables set flags a command line left
// unset: the command line wins, then the environment, then the default.
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Name is the environment variable for flag name under prefix:
// Name("IDEMGATE", "ack-wait") is "IDEMGATE_ACK_WAIT".
func Name(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Apply sets every flag of fs that was not given on the command line from its
// environment variable (see Name), then from the variables of its deprecated
// names (see Deprecate), then from the extra aliases (flag name → variable,
// e.g. "nats-url" → "NATS_URL"). The flags named in commandLineOnly are
// never taken from the environment: a flag that confirms a dangerous act
// (forget --force, approve --yes) must be typed for that one command, not
// left set in a shell for every later one. Every deprecated name given, on
// the command line or as a variable, is warned about on fs.Output(). Call it
// after fs.Parse.
func Apply(fs *flag.FlagSet, prefix string, aliases map[string]string, commandLineOnly ...string) error {
	return apply(fs, prefix, "", aliases, commandLineOnly)
}

// apply is Apply, and for a command whose variables had another prefix,
// kept for one release (Sources.OldPrefix, when not ""): a flag left unset
// by the command line and by the variables of prefix is set from its
// variable under oldPrefix (and those of its deprecated names), before the
// aliases. Every old variable set is warned about on fs.Output(), naming the
// variable to use instead; the new prefix wins over the old.
func apply(fs *flag.FlagSet, prefix, oldPrefix string, aliases map[string]string, commandLineOnly []string) error {
	set := map[string]bool{}
	for _, name := range commandLineOnly {
		set[name] = true
	}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		if name, ok := Deprecated(f); ok {
			warnDeprecated(fs, "--"+f.Name, "--"+name)
		}
	})
	olds := oldNames(fs)
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if _, old := Deprecated(f); old || set[f.Name] || err != nil {
			return
		}
		env := Name(prefix, f.Name)
		v, ok := os.LookupEnv(env)
		for _, old := range olds[f.Name] {
			oldEnv := Name(prefix, old)
			ov, oldSet := os.LookupEnv(oldEnv)
			if !oldSet {
				continue
			}
			warnDeprecated(fs, oldEnv, env)
			if !ok {
				env, v, ok = oldEnv, ov, true
			}
		}
		if oldPrefix != "" {
			for _, name := range append([]string{f.Name}, olds[f.Name]...) {
				oldEnv := Name(oldPrefix, name)
				ov, oldSet := os.LookupEnv(oldEnv)
				if !oldSet {
					continue
				}
				warnDeprecated(fs, oldEnv, Name(prefix, f.Name))
				if !ok {
					env, v, ok = oldEnv, ov, true
				}
			}
		}
		if !ok && aliases[f.Name] != "" {
			env = aliases[f.Name]
			v, ok = os.LookupEnv(env)
		}
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("environment %s=%q: %w", env, v, e)
		}
	})
	return err
}

// oldNames are the deprecated names of the flags of fs, by flag.
func oldNames(fs *flag.FlagSet) map[string][]string {
	olds := map[string][]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if name, ok := Deprecated(f); ok {
			olds[name] = append(olds[name], f.Name)
		}
	})
	return olds
}

// Prefix is the prefix of every command's variables: IDEMGATE_<FLAG>.
const Prefix = "IDEMGATE"

// Sources are where a command's flags come from besides its command line.
type Sources struct {
	// Aliases are other variables some flags are read from (Apply's).
	Aliases map[string]string
	// OldPrefix, when set, is a prefix the command's variables had, still
	// read for one release, with a warning naming the new variable.
	OldPrefix string
	// CommandLineOnly are flags only the command line may set (Apply's).
	CommandLineOnly []string
}

// Load is how every command fills the flags its command line (already
// parsed) left unset: from the environment under Prefix (Apply), then from
// the config file named by config, the command's --config (ApplyFile), when
// set.
func Load(fs *flag.FlagSet, config *string, s Sources) error {
	if err := apply(fs, Prefix, s.OldPrefix, s.Aliases, s.CommandLineOnly); err != nil {
		return err
	}
	if *config == "" {
		return nil
	}
	return ApplyFile(fs, *config, s.CommandLineOnly...)
}
