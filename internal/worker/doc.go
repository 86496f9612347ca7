// Package worker is the consume loop of idemgate: it takes intents from the
// shared durable consumer, admits each (decode, validate, derive its key,
// limits: admit.go), claims its key in the ledger (claim.go), fires the
// effect of the claim's winner under a heartbeated lease and records the
// outcome by compare-and-set (fire.go), and answers every caller (answer.go).
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
// the ledger takes it (fire.go). An effect that keeps failing transiently is
// recorded failed at the consumer's last delivery, and an intent dead-lettered
// unanswered is answered dead_lettered, so no intent ends without an answer or
// a record. One worker a round scans the ledger (janitor.go).
package worker
