// Package logging builds the zap logger of every idemgate command from the
// same two flags, --log-level and --log-format (Register). Every command logs
// to stderr: the MCP server's stdout carries its protocol.
package logging

import (
	"flag"
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Flags are a command's log settings.
type Flags struct {
	// Level is the least severe level logged: debug, info, warn or error
	// (--log-level). Default: info.
	Level string
	// Format is json (one object per line, for collectors) or console (for
	// people) (--log-format). Default: json.
	Format string
}

// Register registers --log-level and --log-format on fs with the defaults of
// d (its zero fields: info, json) and returns the settings they fill.
func Register(fs *flag.FlagSet, d Flags) *Flags {
	if d.Level == "" {
		d.Level = "info"
	}
	if d.Format == "" {
		d.Format = "json"
	}
	f := &Flags{}
	fs.StringVar(&f.Level, "log-level", d.Level, "log level: debug, info, warn or error")
	fs.StringVar(&f.Format, "log-format", d.Format, "log format (to stderr): json, or console for people")
	return f
}

// Logger returns the logger f describes, or an error naming the flag to fix.
func (f *Flags) Logger() (*zap.Logger, error) {
	return New(f.Format, f.Level)
}

// New returns a logger writing format ("json", or "console" for people) at
// level (debug, info, warn or error) to stderr.
func New(format, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	var zc zap.Config
	switch format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true
	default:
		return nil, fmt.Errorf("--log-format %q: use json or console", format)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.OutputPaths, zc.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	return zc.Build()
}
