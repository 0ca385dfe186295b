package idemnats

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fakeMsg is a jetstream.Msg that records how it was settled. The methods
// a Consumer must not call are left to the nil embedded interface, and
// panic.
type fakeMsg struct {
	jetstream.Msg
	id   string
	data []byte

	mu         sync.Mutex // guards the fields below
	settles    []string   // "ack", "term", "term-reason", "nak" in order
	reason     string     // a TermWithReason's
	delay      time.Duration
	inProgress int
	afterDone  int           // InProgress marks after the first settle
	marked     chan struct{} // if not nil, sent to (without blocking) at each InProgress
	failSettle error         // returned by every settle, as a lost connection does
}

func newMsg(id, data string) *fakeMsg { return &fakeMsg{id: id, data: []byte(data)} }

func (m *fakeMsg) Headers() nats.Header {
	h := nats.Header{}
	if m.id != "" {
		h.Set(jetstream.MsgIDHeader, m.id)
	}
	return h
}
func (m *fakeMsg) Data() []byte { return m.data }

func (m *fakeMsg) settle(how string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settles = append(m.settles, how)
	return m.failSettle
}
func (m *fakeMsg) Ack() error  { return m.settle("ack") }
func (m *fakeMsg) Term() error { return m.settle("term") }
func (m *fakeMsg) TermWithReason(reason string) error {
	m.mu.Lock()
	m.reason = reason
	m.mu.Unlock()
	return m.settle("term-reason")
}
func (m *fakeMsg) NakWithDelay(d time.Duration) error {
	m.mu.Lock()
	m.delay = d
	m.mu.Unlock()
	return m.settle("nak")
}
func (m *fakeMsg) InProgress() error {
	m.mu.Lock()
	m.inProgress++
	if len(m.settles) > 0 {
		m.afterDone++
	}
	marked := m.marked
	m.mu.Unlock()
	if marked != nil {
		select {
		case marked <- struct{}{}:
		default:
		}
	}
	return nil
}

func (m *fakeMsg) got() (settles []string, delay time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.settles...), m.delay
}
