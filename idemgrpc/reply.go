package idemgrpc

import (
	"encoding/json"
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// A Reply is what the server interceptor remembers for a key and replays.
type Reply struct {
	Message []byte      // the response, a google.protobuf.Any in wire form; nil if Omitted
	Header  metadata.MD // the headers the handler set (grpc.SetHeader, SendHeader) that are remembered
	Trailer metadata.MD // and the trailers (grpc.SetTrailer)
	Code    codes.Code  // a final error's status code; OK for a response
	Error   string      // and its message
	Status  []byte      // and the whole google.rpc.Status in wire form, details included

	// Omitted, if not zero, is the size in bytes of a response that was
	// not kept, being larger than Options.MaxStoredReply: the call
	// succeeded, and a replay says so without the message (see
	// BodyOmittedHeader). Zero means Message is the whole response.
	Omitted int

	// While the Reply lives in memory (a store without a Backend, or the
	// calls that waited on this one), the response's type and wire form,
	// so that a replay need not find them in Message. raw is a part of
	// Message, not a copy: a reply is held once.
	typ protoreflect.MessageType
	raw []byte
}

// replyJSON is a Reply in JSON, the store's default Codec: metadata values
// travel as bytes, since a -bin value is any bytes at all. Every field is
// optional, so that records written before a field existed still decode.
type replyJSON struct {
	Message []byte              `json:"message,omitempty"`
	Header  map[string][][]byte `json:"header,omitempty"`
	Trailer map[string][][]byte `json:"trailer,omitempty"`
	Code    codes.Code          `json:"code,omitempty"`
	Error   string              `json:"error,omitempty"`
	Status  []byte              `json:"status,omitempty"`
	Omitted int                 `json:"omitted,omitempty"`
}

func (r Reply) MarshalJSON() ([]byte, error) {
	return json.Marshal(replyJSON{Message: r.Message, Header: mdBytes(r.Header), Trailer: mdBytes(r.Trailer),
		Code: r.Code, Error: r.Error, Status: r.Status, Omitted: r.Omitted})
}

func (r *Reply) UnmarshalJSON(data []byte) error {
	var j replyJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*r = Reply{Message: j.Message, Header: mdStrings(j.Header), Trailer: mdStrings(j.Trailer),
		Code: j.Code, Error: j.Error, Status: j.Status, Omitted: j.Omitted}
	return nil
}

func mdBytes(md metadata.MD) map[string][][]byte {
	if len(md) == 0 {
		return nil
	}
	m := make(map[string][][]byte, len(md))
	for k, vs := range md {
		for _, v := range vs {
			m[k] = append(m[k], []byte(v))
		}
	}
	return m
}

func mdStrings(m map[string][][]byte) metadata.MD {
	if len(m) == 0 {
		return nil
	}
	md := make(metadata.MD, len(m))
	for k, vs := range m {
		for _, v := range vs {
			md[k] = append(md[k], string(v))
		}
	}
	return md
}

// decode turns a reply back into the handler's response, a message of its
// own for each caller, or its final status, details included.
func (s *server) decode(reply Reply) (any, error) {
	switch {
	case reply.Code != codes.OK && len(reply.Status) > 0:
		var sp spb.Status
		if err := proto.Unmarshal(reply.Status, &sp); err == nil {
			return nil, status.FromProto(&sp).Err()
		}
		return nil, status.Error(reply.Code, reply.Error)
	case reply.Code != codes.OK:
		return nil, status.Error(reply.Code, reply.Error)
	case reply.Omitted > 0:
		return nil, status.Errorf(codes.AlreadyExists, "the call with this idempotency-key completed; its response (%d bytes) was too large to keep", reply.Omitted)
	}
	typ, raw := reply.typ, reply.raw
	if typ == nil {
		url, value, err := splitAny(reply.Message)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: decoding the remembered response: %v", err)
		}
		if typ, err = protoregistry.GlobalTypes.FindMessageByURL(url); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: decoding the remembered response: %v", err)
		}
		raw = value
	}
	// Decoded into its fields, not passed on as bytes: an interceptor
	// outside this one may read or change the response (redact it, stamp
	// it), and must find it as the handler made it.
	m := typ.New().Interface()
	if err := proto.Unmarshal(raw, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: decoding the remembered response: %v", err)
	}
	return m, nil
}

// The field numbers of google.protobuf.Any.
const (
	anyTypeURL protowire.Number = 1
	anyValue   protowire.Number = 2
)

// marshalAny returns m, whose wire form is size bytes (proto.Size), wrapped
// in a google.protobuf.Any: the bytes proto.Marshal of anypb.New(m) gives,
// made in one buffer of their exact length, and value, m's wire form
// within them. Encoding m straight
// into the Any, rather than on its own and then copied, is what keeps a
// remembered reply to one copy of the response.
func marshalAny(m proto.Message, size int) (wire, value []byte, err error) {
	name := m.ProtoReflect().Descriptor().FullName() // the URL is written from its two parts: no string is made for it
	urlLen := len(typeURLPrefix) + len(name)
	n := protowire.SizeTag(anyTypeURL) + protowire.SizeBytes(urlLen)
	if size > 0 { // proto3 leaves an empty value out
		n += protowire.SizeTag(anyValue) + protowire.SizeBytes(size)
	}
	wire = make([]byte, 0, n)
	wire = protowire.AppendTag(wire, anyTypeURL, protowire.BytesType)
	wire = protowire.AppendVarint(wire, uint64(urlLen))
	wire = append(append(wire, typeURLPrefix...), name...)
	if size == 0 {
		if _, err := proto.Marshal(m); err != nil { // a proto2 message may still lack required fields
			return nil, nil, err
		}
		return wire, wire[len(wire):], nil
	}
	wire = protowire.AppendTag(wire, anyValue, protowire.BytesType)
	wire = protowire.AppendVarint(wire, uint64(size))
	start := len(wire)
	// Sizes cached by the proto.Size just made: the encoding walks the
	// message once, not once more for every nested length.
	if wire, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(wire, m); err != nil {
		return nil, nil, err
	}
	if got := len(wire) - start; got != size {
		// The length prefix is already written: the message changed while
		// it was encoded (the handler shares it with another goroutine).
		return nil, nil, fmt.Errorf("idemgrpc: the response changed while it was encoded (%d bytes, then %d)", size, got)
	}
	return wire, wire[start:], nil
}

// splitAny returns the type URL and the value of a google.protobuf.Any in
// wire form, the value a part of wire, not a copy; as proto.Unmarshal
// does, the last occurrence of a field wins and unknown fields are skipped.
func splitAny(wire []byte) (url string, value []byte, err error) {
	for len(wire) > 0 {
		num, typ, n := protowire.ConsumeTag(wire)
		if n < 0 {
			return "", nil, protowire.ParseError(n)
		}
		wire = wire[n:]
		if typ != protowire.BytesType || (num != anyTypeURL && num != anyValue) {
			if n = protowire.ConsumeFieldValue(num, typ, wire); n < 0 {
				return "", nil, protowire.ParseError(n)
			}
			wire = wire[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(wire)
		if n < 0 {
			return "", nil, protowire.ParseError(n)
		}
		wire = wire[n:]
		if num == anyTypeURL {
			url = string(v)
		} else {
			value = v
		}
	}
	if url == "" {
		return "", nil, errors.New("idemgrpc: the remembered response has no type URL")
	}
	return url, value, nil
}

// typeURLPrefix starts the type URL anypb.New gives a message.
const typeURLPrefix = "type.googleapis.com/"
