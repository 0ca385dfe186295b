package idemgrpc

import (
	"errors"
	"sync"

	"github.com/seed094d4201/idem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// recordingStream passes the headers and trailers a handler sets on to the
// call's stream, every one of them, and keeps a copy of those that are
// remembered.
type recordingStream struct {
	grpc.ServerTransportStream // the call's own; nil in some tests of handlers alone

	keep     metadataPolicy // which headers and trailers are remembered
	maxReply int            // the largest response message remembered, in bytes

	// mu orders what the handler sets, from whatever goroutine, against
	// end: once the handler has returned, nothing more of its is taken,
	// neither passed on nor remembered, so that the call that ran it and
	// every replay carry the metadata it returned with.
	mu      sync.Mutex
	ended   bool        // guarded by mu
	header  metadata.MD // guarded by mu
	trailer metadata.MD // guarded by mu

	// In the transactional mode, what the handler sets is held until its
	// transaction commits (held.go). Guarded by mu.
	held                    bool
	headerSent              bool // a held SendHeader
	heldHeader, heldTrailer metadata.MD
}

// errSetAfterReturn refuses metadata a handler's goroutine sets after the
// handler returned.
var errSetAfterReturn = status.Error(codes.Internal, "idemgrpc: the handler set metadata after it returned; it was neither sent nor remembered")

// end marks the handler returned: what it sets from then on is refused.
func (r *recordingStream) end() {
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
}

func (r *recordingStream) SetHeader(md metadata.MD) error {
	return r.set(md, true, false, grpc.ServerTransportStream.SetHeader)
}

func (r *recordingStream) SendHeader(md metadata.MD) error {
	return r.set(md, true, true, grpc.ServerTransportStream.SendHeader)
}

func (r *recordingStream) SetTrailer(md metadata.MD) error {
	return r.set(md, false, false, grpc.ServerTransportStream.SetTrailer)
}

// set holds md (in the transactional mode) or passes it on to the call's
// stream with pass, and remembers what is kept of it, unless the handler
// has returned. header says whether md is headers (send: from SendHeader)
// or trailers. It holds mu throughout, so that nothing the handler sets
// reaches the stream once end has returned.
func (r *recordingStream) set(md metadata.MD, header, send bool, pass func(grpc.ServerTransportStream, metadata.MD) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return errSetAfterReturn
	}
	if r.held {
		if err := r.hold(md, header, send); err != nil {
			return err
		}
	} else if r.ServerTransportStream != nil {
		if err := pass(r.ServerTransportStream, md); err != nil {
			return err // not sent: not remembered
		}
	}
	if header {
		r.record(&r.header, md)
	} else {
		r.record(&r.trailer, md)
	}
	return nil
}

// record adds the part of md that is remembered to *to. The caller holds
// mu.
func (r *recordingStream) record(to *metadata.MD, md metadata.MD) {
	kept := r.keep.filter(md) // a copy: the handler may change md afterwards
	if kept == nil {
		return
	}
	if *to == nil {
		*to = kept
	} else {
		for k, vs := range kept {
			(*to)[k] = append((*to)[k], vs...)
		}
	}
}

// reply turns the handler's outcome into what the store keeps: a response,
// or a final error with its whole status, as a Reply with a nil error; any
// other error as a *handlerError, which releases the key. A handler that
// succeeded is never released, even if its response cannot be kept: a
// response larger than maxReply is remembered without its message
// (Omitted), and one that cannot be encoded as an Internal error.
func (r *recordingStream) reply(resp any, err error) (Reply, error) {
	r.mu.Lock()
	reply := Reply{Header: r.header, Trailer: r.trailer}
	r.mu.Unlock()
	if err != nil && !idem.IsFinal(err) {
		return Reply{}, &handlerError{err}
	}
	if err == nil {
		m, ok := resp.(proto.Message)
		if !ok || m == nil {
			err = status.Errorf(codes.Internal, "idemgrpc: the handler's response %T is not a protocol buffer message", resp)
		} else if size := proto.Size(m); size > r.maxReply {
			// Measured, not encoded: the caller that ran it gets the
			// handler's own message, and nothing else needs the bytes.
			reply.Omitted = size
			return reply, nil
		} else if reply.Message, reply.raw, err = marshalAny(m, size); err != nil {
			err = status.Errorf(codes.Internal, "idemgrpc: encoding the handler's response: %v", err)
		} else {
			reply.typ = m.ProtoReflect().Type() // the bytes are kept: the handler may change its message
			return reply, nil
		}
	}
	st := status.Convert(err)
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) { // the status itself, not one made of the wrapper's message
		st = gs.GRPCStatus()
	}
	reply.Code, reply.Error = st.Code(), st.Message()
	reply.Status, _ = proto.Marshal(st.Proto()) // Code and Error stand in if this fails
	return reply, nil
}
