package intent

import "strings"

// ForgetSubject is the plain NATS subject (not a stream) an operator
// publishes a key on after deleting its ledger record, "idem.cache.forget"
// for the default prefix. Every worker subscribes to it without a queue
// group and drops the key from its answer cache, so that the next intent of
// the key claims it again instead of being answered from memory. The message
// body is the key, as text.
func (n Names) ForgetSubject() string { return strings.ToLower(n.Prefix) + ".cache.forget" }
