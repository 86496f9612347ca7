package envflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ConfigUsage is the usage of the --config flag of every command, which
// names the file ApplyFile reads.
const ConfigUsage = "a YAML file of settings (flag names to values); the command line and the environment win over it (env IDEMGATE_CONFIG)"

// ApplyFile sets every flag of fs that is still unset — given neither on the
// command line nor by the environment (call it after Apply) — from a YAML
// config file: a mapping of flag names (dashes or underscores) to values; a
// list becomes a comma-separated value. Unknown names and bad values are
// errors with the file's line. The precedence is therefore: command line,
// environment, config file, default. A deprecated name (Deprecate) sets its
// flag unless the file names the flag too, and is warned about on
// fs.Output(). The flags named in commandLineOnly (as for Apply) are errors
// in the file.
func ApplyFile(fs *flag.FlagSet, path string, commandLineOnly ...string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: want a mapping of settings, e.g. ack-wait: 30s", path, root.Line)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	inFile := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		inFile[strings.ReplaceAll(root.Content[i].Value, "_", "-")] = true
	}
	var errs []error
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := strings.ReplaceAll(k.Value, "_", "-")
		f := fs.Lookup(name)
		if f == nil {
			errs = append(errs, fmt.Errorf("%s:%d: unknown setting %q (the settings are the flags: see --help)", path, k.Line, k.Value))
			continue
		}
		if newName, old := Deprecated(f); old {
			warnDeprecated(fs, fmt.Sprintf("%s:%d: %s", path, k.Line, k.Value), newName)
			if inFile[newName] {
				continue // the new name wins
			}
			name = newName
		}
		if slices.Contains(commandLineOnly, name) {
			errs = append(errs, fmt.Errorf("%s:%d: %s is for the command line only: give --%s for the one command that means it", path, k.Line, k.Value, name))
			continue
		}
		if set[name] {
			continue
		}
		var value string
		switch v.Kind {
		case yaml.ScalarNode:
			value = v.Value
		case yaml.SequenceNode:
			items := make([]string, 0, len(v.Content))
			for _, it := range v.Content {
				if it.Kind != yaml.ScalarNode {
					errs = append(errs, fmt.Errorf("%s:%d: %s: list items must be plain values", path, it.Line, k.Value))
				}
				items = append(items, it.Value)
			}
			value = strings.Join(items, ",")
		default:
			errs = append(errs, fmt.Errorf("%s:%d: %s: want a value or a list", path, v.Line, k.Value))
			continue
		}
		if err := fs.Set(name, value); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %s: %q: %v", path, v.Line, k.Value, value, err))
		}
	}
	return errors.Join(errs...)
}
