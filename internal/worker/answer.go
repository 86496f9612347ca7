package worker

import (
	"context"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/tracing"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// answer publishes res to j's caller on the intent's reply subject, if it
// named one, bound to the message it answers: its Idem-Intent-Seq is that
// message's stream sequence (for an approval, the decision's, whose
// Idem-Reply-To it is), which its publisher's PubAck gave it and no one
// else's did. Replies are at most once: callers without one watch the
// ledger. ctx's span goes with it. finish is its one caller.
func (w *Worker) answer(ctx context.Context, j *job, res intent.Result) {
	w.reply(ctx, j.msg.Subject(), j.replyTo, j.meta.Sequence.Stream, res)
	w.obs.answered(j, &res)
}

// reply publishes res on replyTo, the reply subject of the message of
// stream sequence seq published on subject, when replyTo is allowed; ctx's
// span, if any, goes with it.
func (w *Worker) reply(ctx context.Context, subject, replyTo string, seq uint64, res intent.Result) {
	if replyTo == "" {
		return
	}
	if !w.replyAllowed(replyTo) {
		// A reply header naming the ledger's KV subjects, a stream's subject
		// or a system subject would let a caller write there with the
		// worker's permissions: never answer there.
		w.log.Warn("refused reply subject", zap.String("reply_to", replyTo), zap.String("subject", subject))
		w.obs.refusedReply()
		return
	}
	data, err := res.AppendJSON(make([]byte, 0, 512+len(res.Result)+len(res.Receipt)))
	if err != nil {
		w.log.Error("encode answer", zap.Error(err))
		return
	}
	out := nats.NewMsg(replyTo)
	out.Data = data
	if seq > 0 {
		out.Header.Set(intent.HeaderIntentSeq, strconv.FormatUint(seq, 10))
	}
	if ctx != nil {
		otel.GetTextMapPropagator().Inject(ctx, tracing.Header(out.Header))
	}
	if err := w.replies.PublishMsg(out); err != nil {
		w.log.Warn("publish answer", zap.String("reply_to", replyTo), zap.Error(err))
	}
}

// replyAllowed reports whether an answer may be published on subject: a
// literal subject (no wildcards, no spaces) under one of the reply prefixes.
func (w *Worker) replyAllowed(subject string) bool {
	if strings.ContainsAny(subject, "*> \t\r\n") || strings.HasPrefix(subject, "$") {
		return false
	}
	for _, p := range w.cfg.ReplyPrefixes {
		if strings.HasPrefix(subject, p) && len(subject) > len(p) {
			return true
		}
	}
	return false
}

// fromRecord is the answer a ledger record gives this job's caller (a
// conflict when the job's arguments are not the record's; already_done
// for a replayed completion of a tool that rejects repeats).
func (w *Worker) fromRecord(j *job, rec dedup.Record, replayed bool) intent.Result {
	c := dedup.Caller{Key: j.id.Key, Fingerprint: j.id.Fingerprint}
	if j.env != nil {
		c.Tool, c.CallID = j.env.Tool, j.env.CallID
	}
	if j.tool != nil {
		c.RejectRepeat = j.tool.Policy.OnComplete == intent.OnCompleteReject
	}
	return rec.Answer(c, replayed)
}
