// Package audit is idemgate's audit trail: the events of every operation,
// signed and hash-chained per ledger partition, and the receipts every
// final answer carries. docs/audit.md describes the formats; this package
// makes, writes, reads and verifies them.
//
// # Events and receipts
//
// An Event's canonical JSON (RFC 8785) is what is signed and chained. A
// Signer signs events with an Ed25519 key (LoadOrCreateSigner keeps one in
// a PKCS #8 file); SignBatch signs several with one signature over a
// Merkle root, each event carrying its proof, and a BatchSigner gathers
// the events of concurrent callers into such batches. A signed outcome
// event is a receipt: VerifyEvent checks its signature with a KeySet (a
// keys file: public keys and when each is valid), VerifyReceipt also that
// it records the answer it came with.
//
// # The trail
//
// A Trail appends events to the audit stream (EnsureStream), one chain per
// ledger partition: every entry names its predecessor's digest — the first
// its installation's genesis (Installation, GenesisDigest) — and the last
// entry of every append is sealed with the writer's signature. Workers
// sign Checkpoints of every chain (MakeCheckpoints): its installation,
// size and head. Read reads a trail back as JSON lines, History one
// operation's entries, and Verify checks a trail: every signature and
// seal, every chain's order and completeness, and its edges against its
// checkpoints, naming the first break; From verifies only what follows
// checkpoints verified before.
//
// # Guarantees
//
//   - Appending never blocks and never fails: a Trail queues events in
//     memory, bounded, writes them in the background, and drops and counts
//     what it cannot hold; the partition's next append starts with a gap
//     event saying how many were dropped, and when.
//   - Several writers may append to one chain: each append expects the
//     chain's last message and is built again on a new head when another
//     came first, and an append whose acknowledgement was lost is looked
//     for before it is sent again, so the chain has no fork and no repeat.
//   - An edited, dropped or reordered entry, a line that is not its
//     entry's canonical bytes, and a signature by a key not given or not
//     valid then, fails Verify at its line. A trail that stops short of its
//     checkpoints, lacks a partition they name, holds another head or a
//     chain of another installation fails too, at its partition and
//     position. A cut trail ending with an older genuine checkpoint is
//     shown by a checkpoint kept apart (WithCheckpoints).
//   - The set of event kinds and members is open: a verifier checks events
//     it does not know by their signatures and their place in the chain.
package audit
