package idemgrpc

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/limit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// errOverQuota releases a key claimed by a scope over its quota.
var errOverQuota = errors.New("idemgrpc: the scope has made as many new keys as its quota allows")

// setLimits makes the server's quota and waiter cap from its options, and
// says once, when the interceptor is made, that a nil Scope was not
// declared.
func (s *server) setLimits() {
	s.quota = limit.NewQuota(s.opts.ScopeQuota, s.opts.ScopeQuotaWindow, nil)
	s.waiters = limit.NewWaiters(s.opts.MaxWaiters)
	switch {
	case s.opts.Scope == nil && !s.opts.Unscoped:
		s.opts.Logger.Warn("idemgrpc: Options.Scope is nil, so every client shares one key space; set Scope, or Unscoped if one client alone reaches this server")
	case s.opts.Scope != nil && s.opts.Unscoped:
		s.opts.Logger.Error("idemgrpc: Options.Scope and Unscoped are both set; Scope is used")
	}
}

// overQuota is the answer to a scope past its quota: ResourceExhausted,
// with the wait until its oldest key leaves the window. A client can cause
// it at will, so nothing is logged above Debug.
func (s *server) overQuota(scope string) error {
	s.opts.Logger.Debug("idemgrpc: scope over its quota; call refused")
	return s.retryLater(codes.ResourceExhausted, "this client has made as many new calls as it may for now; retry later with the same key", max(time.Second, s.quota.RetryAfter(scope)))
}

// retryLater is a status of code with msg and a RetryInfo of after.
func (s *server) retryLater(code codes.Code, msg string, after time.Duration) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)}); err == nil {
		st = d
	}
	return st.Err()
}

// scopedKey joins scope and key as idemhttp.StoreKey does, so that no other
// pair makes the same store key; one idem would refuse is replaced by its
// hash. An unscoped server's keys are under the empty scope, which Scope is
// never allowed to give, so no key sent to it names a scoped server's
// record.
func scopedKey(scope, key string) string {
	k := strconv.Itoa(len(scope)) + ":" + scope + ":" + key
	if idem.CheckKey(k) == nil {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return fmt.Sprintf("sha256:%x", sum)
}
