// Package worker is the consume loop of idemgate: it takes intents from the
// shared durable consumer, decodes and validates each, claims its key in the
// ledger, fires the effect of the claim's winner under a heartbeated lease,
// records the outcome by compare-and-set, and answers every caller.
//
// Outcomes map to JetStream verbs in one place (verdict.go):
//
//	answered (fired, replayed, conflict, failed)  → Ack
//	transient failure, ledger unreachable, holder
//	  still in flight after the wait               → NakWithDelay
//	bad input (rejected)                          → Term
//	long work (effect, wait for a holder)         → InProgress, periodically
//	panic                                         → recovered, NakWithDelay
//
// An effect that keeps failing transiently is recorded failed at the
// consumer's last delivery, so no intent is left unanswered.
package worker
