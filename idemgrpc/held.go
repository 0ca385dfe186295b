package idemgrpc

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The transactional mode's side of recordingStream: the headers and
// trailers a handler sets are held, every one of them, until its
// transaction commits (or rolls back with an error that is the handler's
// own to deliver), and only then passed on to the call's stream, so that
// nothing of an answer that was not kept reaches the client. SendHeader
// is held too: the headers go out with the answer, not before it.

// errHeaderSentInTx is what gRPC answers a second SendHeader, or a
// SetHeader after one, kept so for a handler whose SendHeader was held.
var errHeaderSentInTx = status.Error(codes.Internal, "idemgrpc: the headers were sent already (SendHeader)")

// hold keeps md, to pass on once the transaction commits. header says
// whether md is headers (send: from SendHeader) or trailers. The caller
// holds mu, and calls it only while the stream holds (r.held).
func (r *recordingStream) hold(md metadata.MD, header, send bool) error {
	switch {
	case !header:
		r.heldTrailer = metadata.Join(r.heldTrailer, md) // a copy: the handler may change md afterwards
		return nil
	case r.headerSent:
		return errHeaderSentInTx
	}
	r.headerSent = send
	r.heldHeader = metadata.Join(r.heldHeader, md)
	return nil
}

// release passes what the handler set on to the call's stream, and from
// then on lets whatever it sets through, as a stream that does not hold
// does. What a handler whose transaction did not commit set is never
// released.
func (r *recordingStream) release() {
	r.mu.Lock()
	header, trailer := r.heldHeader, r.heldTrailer
	r.held, r.heldHeader, r.heldTrailer = false, nil, nil
	r.mu.Unlock()
	if r.ServerTransportStream == nil {
		return
	}
	// Errors are gRPC's to judge, as for a handler's own calls: a call
	// whose stream ended has no one to send them to.
	if len(header) > 0 {
		_ = r.ServerTransportStream.SetHeader(header)
	}
	if len(trailer) > 0 {
		_ = r.ServerTransportStream.SetTrailer(trailer)
	}
}
