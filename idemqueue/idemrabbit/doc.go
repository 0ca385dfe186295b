// Package idemrabbit consumes RabbitMQ messages effectively once: each
// delivery's handler runs through an idem.Store under the message's id
// (its MessageId property), and the delivery is then settled as the
// idemqueue decision says:
//
//	idemqueue.Ack     Ack
//	idemqueue.Reject  Ack (or, with Options.DeadLetter, Nack without requeue:
//	                  the queue's dead-letter exchange takes it)
//	idemqueue.Retry   a copy to the retry queue of its delay, then Ack;
//	                  with no delay, Nack with requeue
//	idemqueue.Hold    with Options.DeadLetter, Nack without requeue; else
//	                  as a Retry after Decision.Delay: never Ack
//
// A delivery without a MessageId (or whose Options.Key fails) is held: its
// work did not happen, and never can without an id. With DeadLetter the
// queue's dead-letter exchange takes it (a queue without one would drop
// it: RabbitMQ drops what is nacked without requeue); otherwise it waits
// in a retry queue and comes back after idemqueue.Options.InterruptedDelay,
// again and again, until an operator moves it or a deploy adds an
// Options.Key that derives a key from its body.
//
// A retry never requeues at once, which would loop hot on a key that is
// still busy: the copy waits in a queue named <queue>.retry.<ms>, whose
// messages live that many milliseconds (x-message-ttl) and are then
// dead-lettered back to <queue> by the default exchange. The copy is
// published with a publisher confirm before the original is acked, so a
// crash between the two leaves a duplicate, which idem makes harmless,
// never a loss. A held message's duplicate has no id to be told apart
// by, and stays one (a Key that later derives its id from the body
// handles both once); with DeadLetter, a held message is never copied. Each delay has its queue because RabbitMQ expires only the
// message at a queue's head: one queue of mixed delays would hold a short
// delay behind a long one. A retry queue is declared at each use and
// deletes itself when unused for its delay plus an hour (x-expires), so
// that the delays a Reconcile hook invents do not pile up queues.
//
// A retried delivery arrives from the default exchange, routed by its
// retry queue; the copy keeps the original's exchange, routing key and
// user_id in headers (x-idem-exchange, x-idem-routing-key,
// x-idem-user-id), and the handler, Key and Payload see the original's.
// The copy's own user_id is the consumer's user, as the broker requires,
// and is how a retried copy is told from a message whose producer set
// those headers itself, which are not believed: a consumer that logs in
// with EXTERNAL (its user unknown to the client) gives its retried
// deliveries as they arrive, from the default exchange. Delays past seven
// days wait seven days. A
// copy that cannot be made (the broker refuses it) puts the delivery back
// after its delay or five seconds, whichever is less.
//
// Run consumes a queue in manual-ack mode with a prefetch, handles up to
// the prefetch of deliveries at once, and keeps going across a closed
// channel or connection: it dials again, with a growing pause. Deliveries
// whose ack was lost with the connection are redelivered by RabbitMQ and
// replayed. RabbitMQ closes a channel whose delivery stays unacked past
// its consumer_timeout (30 minutes by default): keep handlers shorter.
//
// A consumer killed mid-handler leaves its key claimed; RabbitMQ
// redelivers the message at once to the next consumer. What that meets
// depends on the backend: on bolt the key reads as interrupted at Open
// (idem.ErrOutcomeUnknown, answered by idemqueue.Options.Reconcile, by
// default a retry a minute later); on sqlite, postgres and redis it is in
// progress until the dead claim's lease lapses (a retry after
// idemqueue.Options.BusyDelay), and then interrupted. Neither loops hot
// nor dead-letters the message.
//
// A handler whose writes go to the store's own database (bolt, sqlite,
// postgres, mysql) commits them with the message's key and its outcome:
// NewTx, given the store and its backend's RunOnceTx, makes a TxConsumer
// whose handler gets the message and that transaction, typed
// (func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) for sqlite), and
// refuses a store on another backend when it is made.
package idemrabbit
