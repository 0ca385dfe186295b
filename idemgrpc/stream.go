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
	"google.golang.org/protobuf/types/known/anypb"
)

// recordingStream passes the headers and trailers a handler sets on to the
// call's stream and keeps a copy to remember.
type recordingStream struct {
	grpc.ServerTransportStream // the call's own; nil in some tests of handlers alone

	mu      sync.Mutex
	header  metadata.MD // guarded by mu
	trailer metadata.MD // guarded by mu
}

func (r *recordingStream) SetHeader(md metadata.MD) error {
	r.mu.Lock()
	r.header = metadata.Join(r.header, md)
	r.mu.Unlock()
	if r.ServerTransportStream == nil {
		return nil
	}
	return r.ServerTransportStream.SetHeader(md)
}

func (r *recordingStream) SendHeader(md metadata.MD) error {
	r.mu.Lock()
	r.header = metadata.Join(r.header, md)
	r.mu.Unlock()
	if r.ServerTransportStream == nil {
		return nil
	}
	return r.ServerTransportStream.SendHeader(md)
}

func (r *recordingStream) SetTrailer(md metadata.MD) error {
	r.mu.Lock()
	r.trailer = metadata.Join(r.trailer, md)
	r.mu.Unlock()
	if r.ServerTransportStream == nil {
		return nil
	}
	return r.ServerTransportStream.SetTrailer(md)
}

// reply turns the handler's outcome into what the store keeps: a response,
// or a final error with its whole status, as a Reply with a nil error; any
// other error as a *handlerError, which releases the key. A handler that
// succeeded is never released, even if its response cannot be kept: that
// is remembered as an Internal error instead.
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
		} else if reply.raw, err = proto.Marshal(m); err != nil {
			err = status.Errorf(codes.Internal, "idemgrpc: encoding the handler's response: %v", err)
		} else if reply.Message, err = proto.Marshal(&anypb.Any{TypeUrl: typeURL(m), Value: reply.raw}); err != nil {
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

// typeURL is the type URL anypb.New gives m.
func typeURL(m proto.Message) string {
	return "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName())
}
