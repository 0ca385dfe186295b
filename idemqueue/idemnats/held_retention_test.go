package idemnats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A message without an id is held, never lost, whatever the stream's
// retention: on a work-queue or interest stream, a settle that ends the
// message's delivery (an ack, or a term, with a reason or not) also
// deletes it from the stream, so a held message is naked, delivered again
// and kept in the stream for an operator.
func TestHeldMessageStaysInTheStreamWhateverItsRetention(t *testing.T) {
	nc, err := nats.Connect(svctest.NATS(t))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	for _, retention := range []jetstream.RetentionPolicy{jetstream.LimitsPolicy, jetstream.WorkQueuePolicy, jetstream.InterestPolicy} {
		for _, ackRejected := range []bool{false, true} {
			var r [4]byte
			_, _ = rand.Read(r[:])
			name := "IDEMTEST_" + strings.ToUpper(hex.EncodeToString(r[:]))
			subject := "idemtest." + hex.EncodeToString(r[:])
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Retention: retention})
			require.NoError(t, err)
			defer js.DeleteStream(context.Background(), name)
			cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
			require.NoError(t, err)

			store := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
			defer store.Close()
			q, err := idemqueue.New(store, idemqueue.Options{InterruptedDelay: 10 * time.Millisecond})
			require.NoError(t, err)
			c, err := New(q, Options{AckRejected: ackRejected})
			require.NoError(t, err)

			ack, err := js.Publish(ctx, subject, []byte("no id"))
			require.NoError(t, err)
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			require.NoError(t, err)
			var msg jetstream.Msg
			for m := range batch.Messages() {
				msg = m
			}
			require.NotNil(t, msg)
			d, err := c.Handle(ctx, msg, func(context.Context, jetstream.Msg) (int, error) {
				t.Error("a message without an id ran")
				return 0, nil
			})
			require.NoError(t, err)
			assert.Equal(t, idemqueue.Hold, d.Action)
			// Kept: delivered again after InterruptedDelay, and in the
			// stream still.
			batch, err = cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			require.NoError(t, err)
			again := 0
			for m := range batch.Messages() {
				meta, err := m.Metadata()
				require.NoError(t, err)
				assert.Equal(t, ack.Sequence, meta.Sequence.Stream)
				again++
			}
			assert.Equal(t, 1, again, "retention %v, AckRejected %v: the held message was not delivered again", retention, ackRejected)
			_, err = st.GetMsg(ctx, ack.Sequence)
			assert.NoError(t, err, "retention %v, AckRejected %v: the held message is gone from the stream", retention, ackRejected)
		}
	}
}
