// Package idemnats consumes NATS JetStream messages effectively once: each
// message's handler runs through an idem.Store under the message's id
// (its Nats-Msg-Id header, the id the publisher set for JetStream's own
// publish dedupe window), and the message is then settled as the
// idemqueue decision says:
//
//	idemqueue.Ack     Ack
//	idemqueue.Reject  Term (or Ack, with Options.AckRejected)
//	idemqueue.Retry   NakWithDelay(Decision.Delay)
//	idemqueue.Hold    NakWithDelay(Decision.Delay): never Ack nor Term
//
// A message without a Nats-Msg-Id header (or whose Options.Key fails) is
// held: its work did not happen, and never can without an id. It is
// naked with idemqueue.Options.InterruptedDelay, again and again, until
// an operator removes it or a deploy adds an Options.Key that derives a
// key from its body. It is never terminated: a term deletes a message
// from a work-queue or interest stream, as an ack does, and would lose
// it. A consumer's MaxDeliver bounds its deliveries: past it, JetStream
// stops delivering it, leaves it in the stream and reports it
// ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>).
//
// While a delivery is handled (waiting for another delivery of its id,
// then running the handler), the message is marked InProgress every
// Options.ProgressInterval, so that JetStream does not redeliver it to
// another consumer meanwhile; the marks stop when the handler's claim
// loses its lease, so that the broker may redeliver it to whoever takes
// the key over.
//
// A consumer's MaxDeliver counts every delivery, naks included: a message
// retried more often than it allows (a key busy elsewhere, an interrupted
// key kept for an operator, a message without an id held) is no longer
// delivered by JetStream. Leave it unlimited (-1, the default), or above
// what the delays add up to.
//
// JetStream's dedupe window drops a second publish of an id within it
// (two minutes by default); idem makes harmless what the window does not
// cover: a publish after it, and every redelivery (a nak, an ack lost, a
// consumer killed mid-message, AckWait passed).
//
// A consumer killed mid-handler leaves its key claimed. What the restarted
// consumer then meets depends on the backend: on bolt the key reads as
// interrupted at Open (idem.ErrOutcomeUnknown, answered by
// idemqueue.Options.Reconcile, by default a retry a minute later); on
// sqlite, postgres and redis it is in progress until the dead claim's
// lease lapses (a retry after idemqueue.Options.BusyDelay), and then
// interrupted. Neither loops hot nor dead-letters the message.
//
// A handler whose writes go to the store's own database (bolt, sqlite,
// postgres, mysql) commits them with the message's key and its outcome:
// NewTx, given the store and its backend's RunOnceTx, makes a TxConsumer
// whose handler gets the message and that transaction, typed
// (func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) for sqlite), and
// refuses a store on another backend when it is made.
package idemnats
