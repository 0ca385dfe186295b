// Package lifecycle is the life of an idempotency key in one process's
// memory, as one table: the phases a key's entry goes through, the events
// that move it, and for each (phase, event) the phase it moves to and what
// the caller is told. Package idem makes every change of an entry's state
// through Next, and nothing else writes a phase; the model-based suite
// checks the Store against the same table, so a move the table lacks fails
// a test, not a user.
//
// The table below reads top to bottom: for each phase, the events it
// answers. An entry that has left memory (Absent) is never put back: a
// later claim of its key makes a new entry. An operator's Forget of a key
// with no entry, in a store without a Backend, moves none.
//
// What the Backend holds meanwhile is the Backend's own table (see package
// backend): a Claiming or Running entry's claim is pending there under the
// entry's token, renewed by this process; a Pinned entry's outcome is being
// written (settle.go's completeLater), its claim renewed until it lands; a
// claim whose release failed is released later by the Store's releaser
// while memory already holds the key Absent, so the next call here waits
// for that claim in the Backend as it would for another process's.
package lifecycle

import (
	"fmt"
	"sync"
)

// A Phase is a key's state in one process's memory.
type Phase uint8

const (
	Absent      Phase = iota // no entry: the next call claims the key
	Claiming                 // in flight; its claim is on its way to the Backend, which may hold the key for another payload
	Running                  // in flight; the entry's payload is the key's
	Pinned                   // a final outcome the Backend has yet to take: replayed, never expires, until unpinned
	Completed                // a final outcome, memory only: replayed until it expires
	Reconciling              // an operator's Forget or Resolve of the key is at the Backend: calls wait for it, then claim again

	numPhases
)

// An Event is what happens to a key's entry.
type Event uint8

const (
	Claim        Event = iota // a call found the key Absent (or expired), memory only
	ClaimDurable              // a call found the key Absent, with a Backend (or a transaction) to claim it in
	Call                      // a call with the entry's payload
	CallOther                 // a call with another payload
	Confirm                   // the entry's claim landed in the Backend
	Complete                  // the execution's final outcome, memory only
	Pin                       // the execution's final outcome, which the Backend could not yet record
	Release                   // the execution failed before commit, or the Backend answered for the key
	Unpin                     // the Backend took a pinned outcome, or holds another owner's
	Forget                    // the operator drops the key, memory only
	Reconcile                 // the operator's Forget or Resolve, with a Backend, begins
	Reconciled                // it ended, however it went
	Expire                    // the outcome's TTL passed

	numEvents
)

// An Answer is what an event's caller is told.
type Answer uint8

const (
	Invalid  Answer = iota // the table has no such move: a defect in the Store
	Own                    // the caller owns the key: it runs the work and settles the entry
	Wait                   // wait for the entry's outcome
	Recheck                // wait until the entry's claim lands or ends, then call again
	Replay                 // the entry's outcome is the answer
	Mismatch               // refused: the key is another payload's
	Held                   // refused: the key is in flight
	NotYet                 // too early: the entry has yet to reach the phase; try again
	Done                   // the move is made
)

// A Move is a transition: the phase an event moves an entry to, and what
// its caller is told.
type Move struct {
	To     Phase
	Answer Answer
}

// table is the lifecycle. The zero Move is Invalid.
var table = [numPhases][numEvents]Move{
	Absent: {
		Claim:        {Running, Own},     // memory only: the caller runs the work
		ClaimDurable: {Claiming, Own},    // the caller claims the key in the Backend, or its transaction
		Unpin:        {Absent, Done},     // released while its outcome was recorded in the background: the key may be another's now
		Reconcile:    {Reconciling, Own}, // the caller holds the key while it reconciles it in the Backend
	},
	Claiming: {
		Call:      {Claiming, Wait},    // same payload: wait for the outcome
		CallOther: {Claiming, Recheck}, // the Backend may hold the key for the other payload: wait, call again
		Confirm:   {Running, Done},     // the claim landed: the payload is the key's
		Release:   {Absent, Done},      // the claim failed, found an answer, or its transaction ended
		Reconcile: {Claiming, Held},
	},
	Running: {
		Call:      {Running, Wait},
		CallOther: {Running, Mismatch},
		Complete:  {Completed, Done}, // a final outcome, memory only
		Pin:       {Pinned, Done},    // a final outcome the Backend has yet to take
		Release:   {Absent, Done},    // failed before commit, or the Backend remembers the outcome
		Unpin:     {Running, NotYet}, // recorded before its execution pinned it: try again
		Forget:    {Running, Held},
		Reconcile: {Running, Held},
	},
	Pinned: {
		Call:      {Pinned, Replay},
		CallOther: {Pinned, Mismatch},
		Unpin:     {Absent, Done}, // the Backend took it: later calls read the Backend
		Reconcile: {Pinned, Held}, // its outcome is still being recorded by this store, under its claim
	},
	Completed: {
		Call:      {Completed, Replay},
		CallOther: {Completed, Mismatch},
		Forget:    {Absent, Done},
		Expire:    {Absent, Done}, // its TTL passed: a sweep, or a call that finds it
	},
	// A reconciliation lets no claim of its key start here while it
	// works on the Backend's record: one that did could land first and,
	// judged lapsed there by a clock ahead, be dropped or overwritten
	// under its running owner.
	Reconciling: {
		Call:       {Reconciling, Recheck}, // a mark has no payload: a call of any payload waits
		CallOther:  {Reconciling, Recheck},
		Reconcile:  {Reconciling, Held}, // another operator's, at once: an operator's call never waits
		Reconciled: {Absent, Done},
	},
}

// Next returns the move event makes from phase. A Move whose Answer is
// Invalid is a defect in the Store: the caller makes no move, and Strays
// counts it.
func Next(p Phase, e Event) Move {
	m := table[p][e]
	if m.Answer == Invalid {
		stray(p, e)
	}
	return m
}

// InFlight reports whether p is a phase of an execution not yet settled.
func (p Phase) InFlight() bool { return p == Claiming || p == Running }

// A Transition is one row of the table.
type Transition struct {
	From  Phase
	Event Event
	Move
}

// Transitions returns every row of the table, in order.
func Transitions() []Transition {
	var ts []Transition
	for p := range numPhases {
		for e := range numEvents {
			if m := table[p][e]; m.Answer != Invalid {
				ts = append(ts, Transition{p, e, m})
			}
		}
	}
	return ts
}

// Without removes the move event makes from phase until restore is
// called. It is for the tests that prove the model-based suite notices a
// missing transition; nothing else may call it, and never while a Store
// runs elsewhere in the process.
func Without(p Phase, e Event) (restore func()) {
	m := table[p][e]
	table[p][e] = Move{}
	return func() { table[p][e] = m }
}

// strays counts the moves asked of the table that it lacks.
var strays struct {
	sync.Mutex
	n    int
	last string
}

func stray(p Phase, e Event) {
	strays.Lock()
	strays.n++
	strays.last = fmt.Sprintf("%v on %v", e, p)
	strays.Unlock()
}

// Strays returns how many moves the Store asked of the table that it
// lacks, since the process started, and the last of them. Anything but
// zero is a defect: tests check it.
func Strays() (n int, last string) {
	strays.Lock()
	defer strays.Unlock()
	return strays.n, strays.last
}

var phaseNames = [...]string{"Absent", "Claiming", "Running", "Pinned", "Completed", "Reconciling"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", p)
}

var eventNames = [...]string{"Claim", "ClaimDurable", "Call", "CallOther", "Confirm", "Complete", "Pin", "Release", "Unpin", "Forget", "Reconcile", "Reconciled", "Expire"}

func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("Event(%d)", e)
}

var answerNames = [...]string{"Invalid", "Own", "Wait", "Recheck", "Replay", "Mismatch", "Held", "NotYet", "Done"}

func (a Answer) String() string {
	if int(a) < len(answerNames) {
		return answerNames[a]
	}
	return fmt.Sprintf("Answer(%d)", a)
}
