// Package jsbackend keeps the ledger's records in JetStream KV buckets, one
// Bucket per partition: conditional writes (create-only, and
// compare-and-set on a revision), reads answered by the stream's leader,
// watches, scans, group commit in atomic batches, and the buckets' setup
// and stream metadata. It knows records only as bytes under their KV keys:
// what a record means, and which write a ledger makes, is package dedup's.
//
// The contract dedup relies on:
//
//   - A revision is the stream sequence of a key's latest message; it only
//     grows, and every conditional write names the revision it replaces.
//   - Create refuses a key that has a record (ErrExists) and returns it (a
//     key with only a delete marker may be written over, or refused with the
//     marker returned); Update and Delete refuse a key at another revision
//     (ErrRevision). A refused write wrote nothing.
//   - A write whose acknowledgement was lost is settled by a leader read: it
//     is reported written when the leader's latest message is exactly its
//     data, and otherwise returns the error of the write.
//   - Read is answered by the stream leader, so it sees every acknowledged
//     write; a watch or a scan may be served by a lagging replica.
//   - With group commit, every write keeps its own condition and gets the
//     answer it would get alone (see dedup's package documentation).
package jsbackend
