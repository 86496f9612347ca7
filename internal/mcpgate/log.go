package mcpgate

import (
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// sdkLogger is log as the MCP SDK takes it: the SDK's lines go to the gate's
// zap core, in its format and at its level.
func sdkLogger(log *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(log.Core(), zapslog.WithName("mcp-sdk")))
}
