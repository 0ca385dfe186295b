package idemtest

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// A history is what happened to the model's keys, in the order it
// happened, as the executions themselves and the driver saw it: every
// execution's start and end, every event that ends a key's epoch (a
// permit for the next execution), every step run and recorded. The safety
// invariants are judged on it. It is safe for concurrent use: executions
// report from the store's goroutines.
type history struct {
	mu      sync.Mutex
	seq     int                     // guarded by mu; the clock of the history
	execs   map[string][]*execEvent // guarded by mu; by key, in start order
	permits []*permit               // guarded by mu
	steps   map[stepID]stepRecord   // guarded by mu; the steps recorded, by key and name
	// resolves: by key, the stores' clock when an operator's Resolve
	// completed the key; guarded by mu. Its outcome expires as an
	// execution's does, steps and all.
	resolves map[string][]time.Time
	errs     []string // guarded by mu; violations seen by the executions
	lines    []string // guarded by mu; a trace for a failure's report
}

// An execEvent is one execution of a key's fn.
type execEvent struct {
	id       int
	key      string
	store    int
	payload  string
	start    int
	end      int       // 0 while it runs
	outcome  string    // "ok", "final", "fail", "panic", "goexit"; "" while it runs
	value    int       // its success's value
	finalErr string    // its final error's message
	endAt    time.Time // the stores' clock when it ended
	leftStep bool      // it ended with at least one step recorded
}

// expired reports whether an expiry permit p ends e's outcome: e
// completed before it, a TTL or more before the clock p read.
func (p *permit) expired(e *execEvent) bool {
	return e.completedBy(p.from) && !e.endAt.Add(modelTTL).After(p.at)
}

// completedBy reports whether e ended with a final outcome before seq.
func (e *execEvent) completedBy(seq int) bool {
	return e.end != 0 && e.end < seq && (e.outcome == "ok" || e.outcome == "final")
}

// A permit is an event after which a key may run again: its epoch ended.
// A point permit has from == to; a window (a Forget in progress, a renew
// outage) is open (to == -1) until the driver closes it.
type permit struct {
	why      string
	key      string // "" for every key
	store    int    // the store whose execution it concerns; -1 for any
	from, to int
	pending  bool // a window whose validity is not known yet
	valid    bool
	// completed: the permit ends an epoch only for an execution that
	// ended with a final outcome before it, and at least a TTL before
	// the stores' clock read at (an expiry).
	completed bool
	at        time.Time
	resets    bool // the record is gone: recorded steps may run again
	// death: the store died; its executions, even those its goroutines
	// start after (the claim was made before), may be taken over.
	death bool
	// by: the store a Forget ran in.
	by int
	// maybe: a Forget that failed may have landed (its reply lost): the
	// key may run again, but what was recorded before may still replay.
	maybe bool
	// exec, if not 0: the permit is that execution's end (its failure,
	// its ticket's release), and lets only a key it held run again.
	exec int
}

type stepID struct{ key, name string }

type stepRecord struct {
	seq   int
	value int
}

func newHistory() *history {
	return &history{execs: make(map[string][]*execEvent), steps: make(map[stepID]stepRecord), resolves: make(map[string][]time.Time)}
}

// now returns the history's clock.
func (h *history) now() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

func (h *history) tick() int {
	h.seq++
	return h.seq
}

// note adds a line to the trace.
func (h *history) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.noteLocked(format, args...)
}

func (h *history) noteLocked(format string, args ...any) {
	h.lines = append(h.lines, fmt.Sprintf("%4d ", h.seq)+fmt.Sprintf(format, args...))
}

// startExec records an execution's start and returns it.
func (h *history) startExec(id int, key string, store int, payload string) *execEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := &execEvent{id: id, key: key, store: store, payload: payload, start: h.tick()}
	h.execs[key] = append(h.execs[key], e)
	h.noteLocked("exec %d of %s starts in store %d (payload %s)", id, key, store, payload)
	return e
}

// endExec records how an execution ended; an end other than a final
// outcome is a failure before commit, which ends the key's epoch.
func (h *history) endExec(e *execEvent, outcome string, leftStep bool, value int, finalErr string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.end, e.outcome, e.leftStep, e.value, e.finalErr, e.endAt = h.tick(), outcome, leftStep, value, finalErr, at
	h.noteLocked("exec %d of %s ends: %s", e.id, e.key, outcome)
	if outcome != "ok" && outcome != "final" {
		h.permits = append(h.permits, &permit{why: "exec " + fmt.Sprint(e.id) + " failed", key: e.key, store: -1, from: e.end, to: e.end, valid: true, exec: e.id})
	}
}

// ended returns how e ended so far ("" while it runs) and its value.
func (h *history) ended(e *execEvent) (outcome string, value int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return e.outcome, e.value
}

// lost records that e's lease was lost: another owner may have taken its
// key from any time since e began.
func (h *history) lost(e *execEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.permits = append(h.permits, &permit{why: fmt.Sprintf("exec %d lost its lease", e.id), key: e.key, store: -1, from: e.start, to: h.tick(), valid: true, exec: e.id})
	h.noteLocked("exec %d of %s lost its lease", e.id, e.key)
}

// point records a permit that holds from now on.
func (h *history) point(p permit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.from = h.tick()
	p.to = p.from
	h.permits = append(h.permits, &p)
	h.noteLocked("permit: %s (key %q, store %d, valid %v)", p.why, p.key, p.store, p.valid)
}

// open starts a window permit whose validity close decides.
func (h *history) open(p permit) *permit {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.from, p.to, p.pending = h.tick(), -1, true
	h.permits = append(h.permits, &p)
	h.noteLocked("window opens: %s (key %q, store %d)", p.why, p.key, p.store)
	return &p
}

func (h *history) close(p *permit, valid bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.to, p.pending, p.valid = h.tick(), false, valid
	h.noteLocked("window closes: %s (valid %v)", p.why, valid)
}

// closeMaybe closes p as a write that failed but may have landed.
func (h *history) closeMaybe(p *permit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.to, p.pending, p.valid, p.maybe = h.tick(), false, true, true
	h.noteLocked("window closes: %s (it may have landed)", p.why)
}

// allows reports whether p lets next run after prev, and whether that is
// still undecided.
func (p *permit) allows(prev, next *execEvent) (ok, undecided bool) {
	if p.key != "" && p.key != prev.key || p.store >= 0 && p.store != prev.store || p.exec != 0 && p.exec != prev.id {
		return false, false
	}
	if p.from > next.start || !p.death && p.to >= 0 && p.to < prev.start {
		return false, false
	}
	if p.completed && !p.expired(prev) {
		return false, false
	}
	return p.valid, p.pending
}

// judge returns the safety violations in the history so far: two
// executions of a key with no permit between them, and what the
// executions reported themselves (a recorded step that ran again). A pair
// whose permit is still undecided is left for a later judgement.
func (h *history) judge() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append([]string(nil), h.errs...)
	keys := make([]string, 0, len(h.execs))
	for k := range h.execs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ex := h.execs[k]
		for i := 1; i < len(ex); i++ {
			prev, next := ex[i-1], ex[i]
			ok, undecided := false, false
			for _, p := range h.permits {
				a, u := p.allows(prev, next)
				ok = ok || a
				undecided = undecided || u
			}
			if !ok && !undecided {
				out = append(out, fmt.Sprintf("key %s ran twice in one epoch: exec %d (store %d, %s) then exec %d (store %d), with nothing between them that lets it run again", k, prev.id, prev.store, orRunning(prev.outcome), next.id, next.store))
			}
		}
	}
	return out
}

func orRunning(outcome string) string {
	if outcome == "" {
		return "still running"
	}
	return "ended " + outcome
}

// stepRuns checks a step about to run against the steps recorded: a
// recorded step never runs again while its record stands.
func (h *history) stepRuns(key, name string, exec int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tick()
	h.noteLocked("exec %d runs step %s of %s", exec, name, key)
	rec, ok := h.steps[stepID{key, name}]
	if !ok {
		return
	}
	for _, p := range h.permits {
		// A window still open (a Forget, a drop in progress) may have
		// removed the record already.
		if (p.valid || p.pending) && p.resets && (p.key == "" || p.key == key) && p.from > rec.seq && (!p.completed || h.expiredLocked(key, p)) {
			return
		}
	}
	msg := fmt.Sprintf("step %s of key %s ran again in exec %d, though it was recorded (value %d)", name, key, exec, rec.value)
	h.noteLocked("VIOLATION: %s", msg)
	h.errs = append(h.errs, msg)
}

// expiredLocked reports whether the expiry p ends an outcome of key: its
// record, steps and all, is gone.
func (h *history) expiredLocked(key string, p *permit) bool {
	for _, e := range h.execs[key] {
		if p.expired(e) {
			return true
		}
	}
	for _, at := range h.resolves[key] {
		if !at.Add(modelTTL).After(p.at) {
			return true
		}
	}
	return false
}

// resolved records that an operator's Resolve completed key at the
// stores' clock at, before any permit opened after it.
func (h *history) resolved(key string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resolves[key] = append(h.resolves[key], at)
}

// stepDone records what a step returned to fn: ran tells whether its fn
// ran in this call; recorded, whether its outcome is now recorded.
func (h *history) stepDone(key, name string, value int, ran, recorded bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := stepID{key, name}
	if !ran {
		if rec, ok := h.steps[id]; ok && rec.value != value {
			msg := fmt.Sprintf("step %s of key %s replayed %d, but %d was recorded", name, key, value, rec.value)
			h.errs = append(h.errs, msg)
		}
		return
	}
	if recorded {
		h.steps[id] = stepRecord{seq: h.tick(), value: value}
		h.noteLocked("step %s of %s recorded (%d)", name, key, value)
	}
}

// outcomes returns the outcomes key's executions ended with that a call
// which started at seq may replay: those no Forget ended before it
// started. An expired outcome may still replay: until it is swept or the
// key runs again, a clock stepped back makes it live again.
//
// A Forget ends what the store it ran in replays; another store may still
// replay an outcome it holds unrecorded in its memory (store is -1 for a
// judgement of the backend's record).
func (h *history) outcomes(key string, seq, store int) (oks map[int]bool, finals map[string]bool, execs map[int]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var gone []*permit // Forgets before the call
	for _, p := range h.permits {
		if p.valid && p.resets && !p.completed && !p.maybe && (p.key == "" || p.key == key) && p.to >= 0 && p.to < seq && (p.by == store || store < 0) {
			gone = append(gone, p)
		}
	}
	oks, finals, execs = map[int]bool{}, map[string]bool{}, map[int]string{}
	for _, e := range h.execs[key] {
		execs[e.id] = e.outcome
		if slices.ContainsFunc(gone, func(p *permit) bool {
			return e.end != 0 && e.end < p.from
		}) {
			continue
		}
		switch e.outcome {
		case "ok":
			oks[e.value] = true
		case "final":
			finals[e.finalErr] = true
		}
	}
	return oks, finals, execs
}

// running reports whether an execution of key has not ended.
func (h *history) running(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.execs[key] {
		if e.end == 0 {
			return true
		}
	}
	return false
}

func (h *history) trace() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "\n")
}
