package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/limit"
	"github.com/seed094d4201/idem/internal/txrun"
	"github.com/seed094d4201/idem/internal/waitctx"
)

// serveTx is Serve's run in the transactional mode (Options.InTx): the key
// is claimed in a transaction of the store's database, the handler runs in
// it with its response held, and the response goes out only once the
// handler's rows, the key and the response have committed together.
func (g *Guard) serveTx(w http.ResponseWriter, r, req *http.Request, next http.Handler, storeKey string, fp idem.Fingerprint, scope string, lk logKey) {
	wait := txrun.NewWaitBound(r.Context(), g.opts.Wait)
	defer wait.Stop()
	before := w.Header().Clone() // to undo what a handler whose response is not sent set
	rec := newRecorder(w, g.headers, g.opts.MaxStoredBody)
	rec.before, rec.held = before, true
	var quota limit.Reservation
	resp, err := g.opts.InTx(wait.Ctx(), g.store, storeKey, fp[:], func(ctx context.Context) (Response, error) {
		if !wait.Start() {
			return Response{}, txrun.ErrGaveUp
		}
		// Counted only for a key this request claimed, as in Serve.
		var ok bool
		if quota, ok = g.quota.Reserve(scope); !ok {
			return Response{}, errOverQuota
		}
		defer rec.end() // a panic or a Goexit ends it too
		next.ServeHTTP(rec, req.WithContext(ctx))
		rec.end()
		resp, ok := rec.response()
		switch {
		case rec.refused != nil:
			return resp, rec.refused
		case !ok:
			return resp, &notStored{resp, rec.complete()}
		}
		return resp, nil
	})
	if !wait.Started() { // a replay, or why there is none: no handler ran here
		err = waitctx.RanOut(wait.Ctx(), err)
		if refusedInTx(err) {
			// The request this one waited on could not hold its response:
			// it was answered, and logged, already; the store did not fail.
			g.fail(w, req, http.StatusServiceUnavailable, "The request with this Idempotency-Key failed, and nothing of it was saved; retry with the same key.", g.opts.RetryAfter, err)
			return
		}
		g.answer(w, req, next, resp, err, scope, lk)
		return
	}
	var ns *notStored
	var pe *idem.PanicError
	switch {
	case err == nil: // committed: the handler's own response, not a replay
		rec.send(resp.Status)
		return
	case errors.Is(err, errOverQuota):
		g.answer(w, req, next, resp, err, scope, lk)
		return
	case errors.As(err, &pe), errors.Is(err, idem.ErrGoexit): // the handler's goroutine ended
		quota.Cancel()
		g.afterRun(w, req, before, false, err, lk)
		return
	case errors.As(err, &ns): // a 5xx, say: rolled back, and delivered as it is
		quota.Cancel()
		if ns.resp.Status != 0 { // not a ReleaseKey with nothing written
			rec.send(ns.resp.Status)
		}
		return
	}
	// Refused, or the transaction did not commit (the commit failed, the
	// handler ended the transaction itself, ExecutionTimeout): nothing of
	// the handler's is kept, so nothing of its response may be sent.
	quota.Cancel()
	h := w.Header()
	clear(h)
	for k, v := range before {
		h[k] = v
	}
	if rec.refused != nil {
		g.opts.Logger.Error("idemhttp: the handler's response could not be held until its transaction committed; its writes were rolled back", lk.with("err", err)...)
		g.fail(w, req, http.StatusInternalServerError, "The response could not be saved with the request's changes, so nothing was saved; it may be retried with the same key.", 0, err)
		return
	}
	if g.interrupted(r.Context(), storeKey) {
		// The handler ended the transaction itself, and its COMMIT (MySQL)
		// kept its rows with a claim that has no outcome: the request is
		// told what its retries will be, not that nothing was saved.
		g.opts.Logger.Error("idemhttp: the handler committed its transaction itself, so its rows were kept without its response; the key is interrupted until an operator settles it", lk.with("err", err)...)
		g.fail(w, req, http.StatusInternalServerError, "A request with this Idempotency-Key was interrupted and its outcome is unknown; it needs an operator.", 0, fmt.Errorf("%w: %w", idem.ErrOutcomeUnknown, err))
		return
	}
	g.opts.Logger.Error("idemhttp: the handler's transaction did not commit; nothing of it was kept", lk.with("err", err)...)
	g.fail(w, req, http.StatusServiceUnavailable, "The request's changes could not be committed, so nothing was saved; retry with the same key.", g.opts.RetryAfter, err)
}

// interrupted reports whether key's record stands interrupted after a
// transaction of the request's that did not commit: the handler committed
// it itself, keeping the claim without an outcome. A record that cannot be
// read is not taken for one.
func (g *Guard) interrupted(ctx context.Context, key string) bool {
	l := txrun.Of(g.store)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.Options().SettleTimeout)
	defer cancel()
	rec, ok, err := l.Get(ctx, key)
	return err == nil && ok && rec.State == backend.StateInterrupted
}
