package testhttp

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"
)

// Answer is one HTTP answer, read whole.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// retryAttempts and retryPause bound PostRetrying: a few seconds, longer
// than a freshly formed group takes to settle on a loaded machine.
const (
	retryAttempts = 40
	retryPause    = 250 * time.Millisecond
)

// PostRetrying posts a JSON body to url with the given headers through c
// (nil: http.DefaultClient), as a client following the API's contract
// does: a 503 with Retry-After (the affinity log briefly unable to commit,
// e.g. while the group settles after it formed) is sent again, a bounded
// number of times. It returns the last answer.
func PostRetrying(t testing.TB, c *http.Client, url string, body []byte, header map[string]string) Answer {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("POST %s: read the answer: %v", url, err)
		}
		a := Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}
		if a.Status != http.StatusServiceUnavailable || a.Header.Get("Retry-After") == "" || attempt >= retryAttempts {
			return a
		}
		// Retry-After is in whole seconds; the log settles sooner.
		time.Sleep(retryPause)
	}
}
