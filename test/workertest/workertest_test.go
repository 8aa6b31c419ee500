package workertest

import (
	"context"
	"errors"
	"testing"
)

type fake struct {
	started, closed int
	startErr        error
}

func (f *fake) Start(context.Context) error { f.started++; return f.startErr }
func (f *fake) Close(context.Context) error { f.closed++; return nil }

func TestStartClosesAtTheEnd(t *testing.T) {
	var f *fake
	t.Run("run", func(t *testing.T) {
		f = Start(t, func(cfg string) (*fake, error) {
			if cfg != "cfg" {
				return nil, errors.New("wrong config")
			}
			return &fake{}, nil
		}, "cfg")
		if f.started != 1 || f.closed != 0 {
			t.Fatalf("during the test: started %d, closed %d", f.started, f.closed)
		}
	})
	if f.closed != 1 {
		t.Fatalf("after the test: closed %d times, want 1", f.closed)
	}
}
