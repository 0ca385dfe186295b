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
	consume *amqp.Channel
	publish *amqp.Channel
}

// open opens a session on conn: the queue declared if asked, the prefetch
// set, the publisher confirms on.
func open(conn *amqp.Connection, opts Options) (*session, error) {
	s := &session{queue: opts.Queue}
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

// retry has d delivered again after delay: a copy waits in the retry
// queue of that delay, confirmed by the broker before d is acked.
func (s *session) retry(ctx context.Context, d amqp.Delivery, delay time.Duration) error {
	ms := delay.Milliseconds()
	if ms <= 0 {
		return d.Nack(false, true)
	}
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
	// original is acked only then.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	conf, err := s.publish.PublishWithDeferredConfirmWithContext(pctx, "", name, true, false, copyOf(d))
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
	return d.Ack(false)
}

// retryQueue is the name of queue's retry queue for a delay of ms.
func retryQueue(queue string, ms int64) string {
	return queue + ".retry." + strconv.FormatInt(ms, 10)
}

// copyOf is d as a new publishing, persistent.
func copyOf(d amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, MessageId: d.MessageId, Timestamp: d.Timestamp,
		Type: d.Type, UserId: d.UserId, AppId: d.AppId, Body: d.Body,
	}
}

// errClosed is what a session's end is reported as when the broker gave
// no reason.
var errClosed = errors.New("idemrabbit: the channel closed")
