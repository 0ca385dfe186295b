package main

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/sqlite"
)

// A ledger is the payment service's database: its charges table, and its
// idempotency keys beside it, so that a charge, its key and the answer to
// the client commit in one transaction (idemhttp's Options.InTx).
type ledger struct {
	keys   *idem.Store[idemhttp.Response]
	inTx   func(ctx context.Context, store *idem.Store[idemhttp.Response], key string, payload any, fn func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error)
	insert func(ctx context.Context, order, amount int) (int, error) // through the request's transaction
	list   func(ctx context.Context) ([]Charge, error)
	drop   func(ctx context.Context) error // the tables, for a story told on a shared database
	close  func()
}

// openLedger opens the database dsn names: a postgres:// URL, a MySQL or
// MariaDB DSN after "mysql:" (mysql:root@tcp(127.0.0.1:3306)/test), or
// else a SQLite file. Its tables are named prefix+"charges" and
// prefix+"keys", and made if missing.
func openLedger(ctx context.Context, dsn, prefix string) (*ledger, error) {
	charges, keys := prefix+"charges", prefix+"keys"
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, err
		}
		l, err := postgresLedger(ctx, pool, charges, keys)
		if err != nil {
			pool.Close()
		}
		return l, err
	case strings.HasPrefix(dsn, "mysql:"):
		db, err := sql.Open("mysql", strings.TrimPrefix(dsn, "mysql:"))
		if err != nil {
			return nil, err
		}
		b, err := mysql.New(ctx, db, mysql.Options{Table: keys})
		if err == nil {
			_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+charges+` (id BIGINT AUTO_INCREMENT PRIMARY KEY, ord INT NOT NULL, amount INT NOT NULL) ENGINE = InnoDB`)
		}
		if err != nil {
			db.Close()
			return nil, err
		}
		return sqlLedger(db, b, mysql.InTx[idemhttp.Response], mysql.TxFromContext, charges, keys), nil
	}
	db, err := sqlite.Open(dsn)
	if err != nil {
		return nil, err
	}
	b, err := sqlite.New(ctx, db, sqlite.Options{Table: keys})
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+charges+` (id INTEGER PRIMARY KEY, ord INTEGER NOT NULL, amount INTEGER NOT NULL)`)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return sqlLedger(db, b, sqlite.InTx[idemhttp.Response], sqlite.TxFromContext, charges, keys), nil
}

func postgresLedger(ctx context.Context, pool *pgxpool.Pool, charges, keys string) (*ledger, error) {
	b, err := postgres.New(ctx, pool, postgres.Options{Table: keys})
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+charges+` (id BIGSERIAL PRIMARY KEY, ord INT NOT NULL, amount INT NOT NULL)`)
	}
	if err != nil {
		return nil, err
	}
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	return &ledger{
		keys: store,
		inTx: postgres.InTx[idemhttp.Response],
		insert: func(ctx context.Context, order, amount int) (int, error) {
			tx, ok := postgres.TxFromContext(ctx)
			if !ok {
				return 0, errNoTx
			}
			var id int
			err := tx.QueryRow(ctx, `INSERT INTO `+charges+` (ord, amount) VALUES ($1, $2) RETURNING id`, order, amount).Scan(&id)
			return id, err
		},
		list: func(ctx context.Context) ([]Charge, error) {
			rows, err := pool.Query(ctx, `SELECT id, ord, amount FROM `+charges+` ORDER BY id`)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, func(row pgx.CollectableRow) (c Charge, err error) {
				err = row.Scan(&c.ID, &c.Order, &c.Amount)
				return c, err
			})
		},
		drop: func(ctx context.Context) error {
			_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+charges+`, `+keys)
			return err
		},
		close: func() { store.Close(); pool.Close() },
	}, nil
}

// sqlLedger is a ledger on database/sql (MySQL, SQLite).
func sqlLedger(db *sql.DB, b backend.Backend, inTx func(context.Context, *idem.Store[idemhttp.Response], string, any, func(context.Context) (idemhttp.Response, error)) (idemhttp.Response, error), txOf func(context.Context) (*sql.Tx, bool), charges, keys string) *ledger {
	store := idem.New[idemhttp.Response](idem.Options{Backend: b})
	return &ledger{
		keys: store,
		inTx: inTx,
		insert: func(ctx context.Context, order, amount int) (int, error) {
			tx, ok := txOf(ctx)
			if !ok {
				return 0, errNoTx
			}
			res, err := tx.ExecContext(ctx, `INSERT INTO `+charges+` (ord, amount) VALUES (?, ?)`, order, amount)
			if err != nil {
				return 0, err
			}
			id, err := res.LastInsertId()
			return int(id), err
		},
		list: func(ctx context.Context) ([]Charge, error) {
			rows, err := db.QueryContext(ctx, `SELECT id, ord, amount FROM `+charges+` ORDER BY id`)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var all []Charge
			for rows.Next() {
				var c Charge
				if err := rows.Scan(&c.ID, &c.Order, &c.Amount); err != nil {
					return nil, err
				}
				all = append(all, c)
			}
			return all, rows.Err()
		},
		drop: func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+charges)
			if err == nil {
				_, err = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+keys)
			}
			return err
		},
		close: func() { store.Close(); db.Close() },
	}
}

// errNoTx is a charge outside the middleware's transaction: a wiring bug.
var errNoTx = errors.New("payments: the charge has no transaction: is the handler behind idemhttp.Middleware with InTx?")
