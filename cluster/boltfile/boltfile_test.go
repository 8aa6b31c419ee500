package boltfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func realFile(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("b"))
		if err != nil {
			return err
		}
		for i := range 3000 {
			if err := b.Put(fmt.Appendf(nil, "key-%05d", i), make([]byte, 64)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A second transaction so both meta pages are valid.
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Delete([]byte("key-00001")) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, b
}

func TestCheck(t *testing.T) {
	path, orig := realFile(t)
	write := func(b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Check(path); err != nil {
		t.Fatalf("a healthy file: %v", err)
	}
	if err := Check(filepath.Join(t.TempDir(), "missing.db")); err != nil {
		t.Fatalf("a missing file: %v", err)
	}
	write(nil)
	if err := Check(path); err != nil {
		t.Fatalf("an empty file: %v", err)
	}
	write([]byte("not a bolt file at all, just text"))
	if err := Check(path); err != nil {
		t.Fatalf("garbage is left to bbolt's own error: %v", err)
	}
	for _, cut := range []int{len(orig) / 3, len(orig) / 2, 8192 + 100} {
		write(orig[:cut])
		if err := Check(path); !errors.Is(err, ErrDamaged) {
			t.Errorf("truncated to %d of %d bytes: %v, want ErrDamaged", cut, len(orig), err)
		}
		// What Check lets through, bbolt opens without panicking.
	}
	// Every cut bbolt would panic or fault on is caught: try them all at
	// page granularity, and check that whatever passes opens.
	for cut := 0; cut <= len(orig); cut += 4096 {
		write(orig[:cut])
		if Check(path) != nil {
			continue
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("cut at %d passed the check but bbolt panicked: %v", cut, r)
				}
			}()
			if db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true}); err == nil {
				db.Close()
			}
		}()
	}
}
