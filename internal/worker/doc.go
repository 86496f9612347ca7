// Package worker is the consume loop of idemgate: it takes intents from the
// shared durable consumer and takes each through a sequence of stages, each
// a function that returns what happened as a value (handle.go reads it top
// to bottom):
//
//	receive   its span and metadata                         handle.go
//	overdue   delivered past its last delivery: dead-letter deadletter.go
//	control   an operator's decision: approve, deny, resolve control.go
//	admit     decode, validate, derive its key              admit.go
//	limit     the session's rate, the tool's in-flight cap  limits.go
//	direct    a tool without the ledger fires               direct.go
//	claim     its key in the ledger: a lease won, a record  claim.go
//	          that answers it (replay), a holder to wait for
//	act       on a lease won: hold as uncertain, park for   act.go
//	          approval, or fire
//	fire      the effect, on a goroutine of its own         fire.go
//	conclude  record the outcome under the lease, by CAS    conclude.go
//	finish    letter, answer, settle                        handle.go
//
// A stage that ends an intent returns it handled: the answer for its caller,
// if any, and the verdict to settle its message with. act hands an effect to
// fire as a firing, whose goroutine concludes and finishes the intent.
// finish is the one place a caller is answered (answer.go) and a message
// settled (verdict.go). What the stages come to is observed in one place
// (observe.go: the intent's span, stage times, metrics and audit trail
// events), and a panic in them is recovered in one (rescue, handle.go).
// The stages reach the outside through interfaces declared here
// (ledger.go): the ledger and its lease (a *dedup.Ledger), the intent's
// message, and the publishers of answers and dead letters; the unit tests
// run them on fakes that keep the same contracts (TestLedgerContract).
//
// Outcomes map to JetStream verbs in one place (verdict.go):
//
//	answered (fired, replayed, conflict, failed)  → Ack
//	transient failure, holder still in flight
//	  after the wait                              → NakWithDelay
//	bad input (rejected), out of deliveries       → Term, dead letter, answered
//	long work (effect, wait for a holder, a tool
//	  at its cap, a ledger outage)                → InProgress, periodically
//	panic                                         → recovered, NakWithDelay
//
// Waiting never spends a delivery: a tool at its max_in_flight cap queues its
// intents (limits.go), and an unreachable ledger holds the intent and is
// tried again (claim.go), while a holder that knows its outcome keeps it until
// the ledger takes it (conclude.go). An effect that keeps failing transiently
// is recorded failed at the consumer's last delivery, and an intent
// dead-lettered unanswered is answered dead_lettered, so no intent ends
// without an answer or a record. One worker a round scans the ledger
// (janitor.go).
package worker
