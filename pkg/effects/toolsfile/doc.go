// Package toolsfile reads a tools file (YAML; the format is in
// docs/tools.md) into an *effects.Registry: each tool's name, how its keys
// are derived (intent.KeySpec), its lease and policy, and its effect — a
// kind and that kind's settings.
//
// # Problems
//
// Parse and LoadFile report every problem at once, each as a *ConfigError
// with the file, line, field and a hint, joined in line order; each matches
// ErrConfig, so a caller tells a bad file from an unreadable one. Unknown
// fields are problems, so a typo never passes silently. So is an unsafe
// tool whose key a model could choose: keyed by all its args, with no
// closed schema to refuse an arg the model invents; it needs key_args, a
// closed schema or key_args: all (docs/tools.md, "An unsafe tool names its
// operation"). A file either loads whole or not at all.
//
// # Warnings
//
// Settings that load but probably misbehave are kept as warnings
// (Registry.Warnings), with their lines:
//
//   - a field that can enter a tool's key and whose name looks like a
//     timestamp, an attempt counter or a random id (see volatileLooking),
//     while it is not declared in volatile_args: such a value differs
//     between two calls of one operation, so the second call would get
//     another key and fire again. The fields checked are the tool's
//     key_args, or, for a tool keyed by all its args, the property names of
//     its schema;
//   - a webhook, or an mcp tool with a url of its own, whose URL names a
//     loopback, private or otherwise restricted address (an IP literal, or
//     localhost) that neither its allow_private nor WithAllowPrivate
//     allows: every request to it would be refused when it fires;
//   - an upstream tool (mcp_upstreams) its server marks readOnlyHint or
//     idempotentHint while the file gives it no class: it is served unsafe,
//     through the ledger, because only the tools file decides a class.
//
// # Kinds
//
// The kinds a file may name are fixed, in one table (kinds.go): webhook,
// smtp, mcp and noop, and nats when the caller passes its connection
// (WithNATSConn). Each reads its settings block and builds the effect with
// its package's constructor (pkg/effects/webhook and the others), whose
// *effects.SettingErrors are reported at their fields' lines. A tool
// written in another language is served as a NATS service (the nats
// effect) or as an MCP server (the mcp effect); a file's mcp_upstreams
// entries serve an upstream's whole tool list, kept current with it.
package toolsfile
