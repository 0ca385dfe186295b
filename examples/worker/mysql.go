package main

import (
	"context"
	"database/sql"
	"errors"
	"os"

	_ "github.com/go-sql-driver/mysql"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/mysql"
)

// mysqlEnv names the MySQL or MariaDB database (a go-sql-driver DSN, such
// as root@tcp(127.0.0.1:3306)/test) the story also runs on, when set.
const mysqlEnv = "IDEM_MYSQL_DSN"

// mysqlStock keeps the stock in a table of the same MySQL database as the
// keys: prefix+"stock" beside prefix+"keys".
type mysqlStock struct {
	db     *sql.DB
	keys   *idem.Store[int]
	stock  string
	inside func(Event)
}

func openMySQL(prefix string, inside func(Event)) (*mysqlStock, error) {
	db, err := sql.Open("mysql", os.Getenv(mysqlEnv))
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	stock := "`" + prefix + "stock`"
	b, err := mysql.New(ctx, db, mysql.Options{Table: prefix + "keys"})
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+stock+` (item VARCHAR(64) PRIMARY KEY, count INT NOT NULL) ENGINE = InnoDB`)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `INSERT IGNORE INTO `+stock+` VALUES ('dosa-mix', ?), ('idli-rava', ?)`, seed["dosa-mix"], seed["idli-rava"])
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return &mysqlStock{db: db, keys: keys(b), stock: stock, inside: inside}, nil
}

func (s *mysqlStock) Apply(ctx context.Context, e Event) (int, bool, error) {
	applied := false
	left, err := mysql.RunOnceTx(ctx, s.keys, e.ID, e, func(ctx context.Context, tx *sql.Tx) (int, error) {
		applied = true
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.stock+` (item, count) VALUES (?, ?)
ON DUPLICATE KEY UPDATE count = count + ?`, e.Item, e.Delta, e.Delta); err != nil {
			return 0, err
		}
		var left int
		err := tx.QueryRowContext(ctx, `SELECT count FROM `+s.stock+` WHERE item = ?`, e.Item).Scan(&left)
		if err == nil && s.inside != nil {
			s.inside(e)
		}
		return left, err
	})
	return left, applied && err == nil, err
}

func (s *mysqlStock) Levels(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT item, count FROM `+s.stock)
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

func (s *mysqlStock) Done(ctx context.Context) (int, error) { return done(ctx, s.keys) }

func (s *mysqlStock) Close() error { return errors.Join(s.keys.Close(), s.db.Close()) }

// dropMySQL drops the story's two tables.
func dropMySQL(prefix string) error {
	db, err := sql.Open("mysql", os.Getenv(mysqlEnv))
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec("DROP TABLE IF EXISTS `" + prefix + "stock`, `" + prefix + "keys`")
	return err
}
