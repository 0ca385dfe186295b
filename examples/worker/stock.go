package main

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/sqlite"
	bbolt "go.etcd.io/bbolt"
)

// An Event is one stock change. The order service gives it its ID when it
// saves the order, and every delivery of the event carries the same ID.
type Event struct {
	ID    string
	Item  string
	Delta int // negative takes items out of stock
}

// A Stock is the worker's own data, the stock levels, in one file with its
// idempotency keys: the "done" note of each event is idem's record of the
// event's ID, committed in the same transaction as the stock change.
type Stock interface {
	// Apply applies e once per e.ID, however many times it is delivered,
	// and returns what is left of e.Item, and whether this call changed it
	// (false: the event was seen before).
	Apply(ctx context.Context, e Event) (left int, applied bool, err error)
	// Levels returns every item's stock.
	Levels(ctx context.Context) (map[string]int, error)
	// Done returns how many events have a done note.
	Done(ctx context.Context) (int, error)
	Close() error
}

// openStock opens the stock of kind "sqlite" or "bolt" at path, or of
// kind "mysql" in tables whose names start with path. inside, if
// set, runs inside each event's transaction after its change: the story
// uses it to kill the worker there.
func openStock(kind, path string, inside func(Event)) (Stock, error) {
	switch kind {
	case "sqlite":
		return openSQLite(path, inside)
	case "bolt":
		return openBolt(path, inside)
	case "mysql": // path is the tables' prefix
		return openMySQL(path, inside)
	}
	return nil, fmt.Errorf("unknown stock kind %q (sqlite, bolt or mysql)", kind)
}

// keys is the idempotency store: an event's outcome is the stock left. An
// event's done note is kept for a week, well past the longest time the
// broker may hold a message and hand it out again; a delivery after that
// would be applied again.
func keys(b backend.Backend) *idem.Store[int] {
	return idem.New[int](idem.Options{Backend: b, TTL: 7 * 24 * time.Hour})
}

// seed is the stock a new file starts with.
var seed = map[string]int{"dosa-mix": 10, "idli-rava": 10}

// sqliteStock keeps the stock in a table of the same SQLite file as the
// keys.
type sqliteStock struct {
	db     *sql.DB
	keys   *idem.Store[int]
	inside func(Event)
}

func openSQLite(path string, inside func(Event)) (*sqliteStock, error) {
	db, err := sqlite.Open(path)
	if err != nil {
		return nil, err
	}
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	if err == nil {
		_, err = db.Exec(`CREATE TABLE IF NOT EXISTS stock (item TEXT PRIMARY KEY, count INTEGER NOT NULL);
INSERT OR IGNORE INTO stock VALUES ('dosa-mix', ?), ('idli-rava', ?)`, seed["dosa-mix"], seed["idli-rava"])
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return &sqliteStock{db: db, keys: keys(b), inside: inside}, nil
}

func (s *sqliteStock) Apply(ctx context.Context, e Event) (int, bool, error) {
	applied := false
	left, err := sqlite.RunOnceTx(ctx, s.keys, e.ID, e, func(ctx context.Context, tx *sql.Tx) (int, error) {
		applied = true
		var left int
		err := tx.QueryRowContext(ctx, `INSERT INTO stock (item, count) VALUES (?1, ?2)
ON CONFLICT (item) DO UPDATE SET count = count + ?2 RETURNING count`, e.Item, e.Delta).Scan(&left)
		if err == nil && s.inside != nil {
			s.inside(e)
		}
		return left, err
	})
	return left, applied && err == nil, err
}

func (s *sqliteStock) Levels(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT item, count FROM stock`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	levels := map[string]int{}
	for rows.Next() {
		var item string
		var n int
		if err := rows.Scan(&item, &n); err != nil {
			return nil, err
		}
		levels[item] = n
	}
	return levels, rows.Err()
}

func (s *sqliteStock) Done(ctx context.Context) (int, error) { return done(ctx, s.keys) }

func (s *sqliteStock) Close() error { return errors.Join(s.keys.Close(), s.db.Close()) }

// boltStock keeps the stock in a bucket of the same bbolt file as the keys.
type boltStock struct {
	b      *bolt.Backend
	keys   *idem.Store[int]
	inside func(Event)
}

var stockBucket = []byte("stock") // item -> count, 8 bytes big-endian

func openBolt(path string, inside func(Event)) (*boltStock, error) {
	b, err := bolt.Open(path, nil)
	if err != nil {
		return nil, err
	}
	err = b.Update(context.Background(), func(tx *bbolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(stockBucket)
		if err != nil {
			return err
		}
		for item, n := range seed {
			if bk.Get([]byte(item)) == nil {
				if err := bk.Put([]byte(item), binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Close()
		return nil, err
	}
	return &boltStock{b: b, keys: keys(b), inside: inside}, nil
}

func (s *boltStock) Apply(ctx context.Context, e Event) (int, bool, error) {
	applied := false
	left, err := bolt.RunOnceTx(ctx, s.keys, e.ID, e, func(ctx context.Context, tx *bbolt.Tx) (int, error) {
		applied = true
		bk := tx.Bucket(stockBucket)
		left := e.Delta
		if v := bk.Get([]byte(e.Item)); v != nil {
			left += int(int64(binary.BigEndian.Uint64(v)))
		}
		if err := bk.Put([]byte(e.Item), binary.BigEndian.AppendUint64(nil, uint64(left))); err != nil {
			return 0, err
		}
		if s.inside != nil {
			s.inside(e)
		}
		return left, nil
	})
	return left, applied && err == nil, err
}

func (s *boltStock) Levels(ctx context.Context) (map[string]int, error) {
	levels := map[string]int{}
	err := s.b.View(ctx, func(tx *bbolt.Tx) error {
		return tx.Bucket(stockBucket).ForEach(func(k, v []byte) error {
			levels[string(k)] = int(int64(binary.BigEndian.Uint64(v)))
			return nil
		})
	})
	return levels, err
}

func (s *boltStock) Done(ctx context.Context) (int, error) { return done(ctx, s.keys) }

func (s *boltStock) Close() error { return errors.Join(s.keys.Close(), s.b.Close()) }

// done counts the completed records: the events applied.
func done(ctx context.Context, keys *idem.Store[int]) (int, error) {
	n := 0
	for _, err := range keys.Records(ctx, backend.StateCompleted) {
		if err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}
