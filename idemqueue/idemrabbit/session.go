package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A session is one connection's channels: one consuming the queue, one in
// confirm mode publishing the copies that retries wait in.
type session struct {
	queue   string
	user    string // the connection's user, by its SASL mechanism; "" if it names none
	consume *amqp.Channel
	publish *amqp.Channel
	ended   chan struct{} // closed when the session stops taking deliveries
}

// open opens a session on conn: the queue declared if asked, the prefetch
// set, the publisher confirms on.
func open(conn *amqp.Connection, opts Options) (*session, error) {
	s := &session{queue: opts.Queue, user: userOf(conn), ended: make(chan struct{})}
	var err error
	if s.consume, err = conn.Channel(); err != nil {
		return nil, err
	}
	if s.publish, err = conn.Channel(); err != nil {
		return nil, err
	}
	if err := s.publish.Confirm(false); err != nil {
		return nil, fmt.Errorf("publisher confirms: %w", err)
	}
	if opts.Declare {
		var args amqp.Table
		if opts.DeadLetter {
			dead := opts.Queue + ".dead"
			if _, err := s.consume.QueueDeclare(dead, true, false, false, false, nil); err != nil {
				return nil, fmt.Errorf("declaring %s: %w", dead, err)
			}
			args = amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
		}
		if _, err := s.consume.QueueDeclare(opts.Queue, true, false, false, false, args); err != nil {
			return nil, fmt.Errorf("declaring %s: %w", opts.Queue, err)
		}
	}
	if err := s.consume.Qos(opts.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("prefetch: %w", err)
	}
	return s, nil
}

func (s *session) ack(d amqp.Delivery) error { return d.Ack(false) }

func (s *session) reject(d amqp.Delivery, deadLetter bool) error {
	if deadLetter {
		return d.Nack(false, false)
	}
	return d.Ack(false)
}

// maxDelay is the longest a retry waits: RabbitMQ refuses a retry queue
// whose x-expires is much longer (value_too_large), and a declare it
// refuses closes the channel.
const maxDelay = 7 * 24 * time.Hour

// retry has d delivered again after delay: a copy waits in the retry
// queue of that delay, confirmed by the broker before d is acked. If the
// copy cannot be made, d is put back (Nack with requeue) after the delay
// or at most a few seconds, or as the session ends: never left unacked on
// a live channel, where it would hold a prefetch slot for good.
func (s *session) retry(ctx context.Context, d amqp.Delivery, delay time.Duration) error {
	if delay <= 0 {
		return d.Nack(false, true)
	}
	err := s.copyToRetry(ctx, d, min(delay, maxDelay))
	if err == nil {
		return d.Ack(false)
	}
	t := time.NewTimer(min(delay, 5*time.Second))
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.ended:
	case <-ctx.Done():
	}
	return errors.Join(err, d.Nack(false, true))
}

// copyToRetry publishes a copy of d to the retry queue of delay and waits
// for the broker's confirm.
func (s *session) copyToRetry(ctx context.Context, d amqp.Delivery, delay time.Duration) error {
	ms := (delay + time.Millisecond - 1).Milliseconds() // under 1 ms is 1 ms, not at once
	// Declared at every use: x-expires counts a declare as a use, not a
	// publish, and a retry queue that expired would take its copies.
	name := retryQueue(s.queue, ms)
	if _, err := s.publish.QueueDeclare(name, true, false, false, false, amqp.Table{
		"x-message-ttl":             ms,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": s.queue,
		"x-expires":                 ms + time.Hour.Milliseconds(),
	}); err != nil {
		return fmt.Errorf("declaring %s: %w", name, err)
	}
	// The copy must be confirmed whatever the caller's ctx: the
	// original is acked only then. Not mandatory: the queue was just
	// declared, and a returned copy would be confirmed all the same.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	conf, err := s.publish.PublishWithDeferredConfirmWithContext(pctx, "", name, false, false, copyOf(d, s.user))
	if err != nil {
		return fmt.Errorf("publishing to %s: %w", name, err)
	}
	ok, err := conf.WaitContext(pctx)
	switch {
	case err != nil:
		return fmt.Errorf("confirming the copy in %s: %w", name, err)
	case !ok:
		return fmt.Errorf("the broker refused the copy in %s", name)
	}
	return nil
}

// retryQueue is the name of queue's retry queue for a delay of ms.
func retryQueue(queue string, ms int64) string {
	return queue + ".retry." + strconv.FormatInt(ms, 10)
}

// The headers a copy keeps its original's exchange, routing key and
// user_id in: a retried delivery arrives from the default exchange, routed
// by its retry queue, published by the consumer's user, and Run gives the
// handler the original's back.
const (
	exchangeHeader   = "x-idem-exchange"
	routingKeyHeader = "x-idem-routing-key"
	userIDHeader     = "x-idem-user-id"
)

// userOf returns the user conn authenticated as, if its SASL mechanism
// names one.
func userOf(conn *amqp.Connection) string {
	for _, a := range conn.Config.SASL {
		switch a := a.(type) {
		case *amqp.PlainAuth:
			return a.Username
		case *amqp.AMQPlainAuth:
			return a.Username
		}
	}
	return ""
}

// copyOf is d as a new publishing, persistent, published by user (the
// consumer's), with d's exchange, routing key and user_id in headers.
// Its own user_id is user, which the broker checks against the
// publishing connection's (it refuses another user's with
// PRECONDITION_FAILED, closing the channel), and which restored takes as
// the broker's word that the message is the consumer's copy.
func copyOf(d amqp.Delivery, user string) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[exchangeHeader], headers[routingKeyHeader] = d.Exchange, d.RoutingKey
	delete(headers, userIDHeader)
	if d.UserId != "" {
		headers[userIDHeader] = d.UserId
	}
	return amqp.Publishing{
		Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, MessageId: d.MessageId, Timestamp: d.Timestamp,
		Type: d.Type, UserId: user, AppId: d.AppId, Body: d.Body,
	}
}

// restored is d with the exchange, routing key and user_id of the
// delivery it is a retried copy of, if it is one: the broker says the
// consumer's own user (user) published it, and it has the headers copyOf
// sets. Any producer can set those headers on a message of its own; they
// are not believed from another user, nor when the consumer's user is not
// known (an EXTERNAL login), so that no producer makes the handler see an
// exchange or a routing key it did not publish to.
func restored(d amqp.Delivery, user string) amqp.Delivery {
	if user == "" || d.UserId != user {
		return d
	}
	ex, ok1 := d.Headers[exchangeHeader].(string)
	rk, ok2 := d.Headers[routingKeyHeader].(string)
	if ok1 && ok2 {
		d.Exchange, d.RoutingKey = ex, rk
		d.UserId, _ = d.Headers[userIDHeader].(string)
	}
	return d
}

// errClosed is what a session's end is reported as when the broker gave
// no reason.
var errClosed = errors.New("idemrabbit: the channel closed")
