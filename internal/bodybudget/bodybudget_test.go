package bodybudget

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// onlyReader hides bytes.Reader's other methods (a body of unknown length).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestBudgetRefusesBeyondItsLimitAndReleases(t *testing.T) {
	b := New(1000)
	body := strings.Repeat("x", 600)
	d1, rel1, err := b.Read(strings.NewReader(body), 600, 800)
	if err != nil || string(d1) != body || b.InUse() != 600 {
		t.Fatalf("first body: %v, %d held", err, b.InUse())
	}
	if _, _, err := b.Read(strings.NewReader(body), 600, 800); !errors.Is(err, ErrExceeded) {
		t.Fatalf("second body beyond the budget: %v", err)
	}
	if b.InUse() != 600 {
		t.Fatalf("a refused body holds bytes: %d", b.InUse())
	}
	if _, _, err := b.Read(strings.NewReader(body+body), 1200, 800); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("declared beyond max: %v", err)
	}
	rel1()
	rel1()
	if b.InUse() != 0 {
		t.Fatalf("released twice: %d held", b.InUse())
	}
}

func TestBudgetUnknownLength(t *testing.T) {
	b := New(300 << 10)
	data := bytes.Repeat([]byte("y"), 200<<10)
	got, rel, err := b.Read(onlyReader{bytes.NewReader(data)}, -1, 250<<10)
	if err != nil || !bytes.Equal(got, data) || b.InUse() != int64(len(data)) {
		t.Fatalf("unknown length: %v, %d bytes, %d held", err, len(got), b.InUse())
	}
	// A second one does not fit the rest of the budget: refused part-way,
	// holding nothing.
	if _, _, err := b.Read(onlyReader{bytes.NewReader(data)}, -1, 250<<10); !errors.Is(err, ErrExceeded) {
		t.Fatalf("second unknown-length body: %v", err)
	}
	if b.InUse() != int64(len(data)) {
		t.Fatalf("refused body still holds bytes: %d", b.InUse())
	}
	rel()
	if _, _, err := b.Read(onlyReader{bytes.NewReader(bytes.Repeat([]byte("z"), 260<<10))}, -1, 250<<10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("unknown length beyond max: %v", err)
	}
	if b.InUse() != 0 {
		t.Fatalf("%d held after a too-large body", b.InUse())
	}
}
