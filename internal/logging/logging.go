// Package logging builds the zap loggers of idemgate's commands from their
// --log-format and --log-level flags.
package logging

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger writing format ("json", or "console" for people)
// at level (debug, info, warn or error).
func New(format, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level %q: use debug, info, warn or error", level)
	}
	var zc zap.Config
	switch format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true
	default:
		return nil, fmt.Errorf("log format %q: use json or console", format)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	return zc.Build()
}
