package bolt

import (
	"encoding/binary"

	"go.etcd.io/bbolt"
)

// A clean stop. Close commits, as the file's last transaction, a mark in
// the meta bucket that holds that transaction's own id. The newest meta
// page names the same transaction only if nothing has written the file
// since: a process killed or a machine that crashed while the file was
// open, a torn last commit (bbolt falls back to the meta before it), and
// another program's commit all leave a meta with another id. Such a file
// was last written by code that had checked it, so Open need not read all
// of it again; any other gets the full check.
var cleanKey = []byte("clean")

// markClean commits the clean-stop mark.
func markClean(db *bbolt.DB) error {
	return update(db, func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return nil
		}
		return meta.Put(cleanKey, binary.BigEndian.AppendUint64(nil, uint64(tx.ID())))
	})
}

// stoppedCleanly reports whether the file's newest transaction is a clean
// stop's mark.
func stoppedCleanly(db *bbolt.DB) (clean bool, err error) {
	err = view(db, func(tx *bbolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta != nil {
			v := meta.Get(cleanKey)
			clean = len(v) == 8 && binary.BigEndian.Uint64(v) == uint64(tx.ID())
		}
		return nil
	})
	return clean, err
}
