package reliability

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Header-level rejections (a header net/http refuses before any handler
// runs) answered in the path's own API shape, like every other refusal:
// Anthropic's {"type":"error","error":{"type","message"}} on /v1/messages,
// OpenAI's {"error":{"message","type","param","code"}} on /v1/responses
// and /v1/conversations, with the API's lowercase field names.
func TestHeaderLevelRejectionsInThePathsShape(t *testing.T) {
	st := smallStack(t)
	addr := st.Edges()[0].Addr()
	headers := map[string]string{
		"a NUL in a header value":    "X-Junk: a\x00b\r\n",
		"a bare CR in a header":      "X-Junk: a\rb\r\n",
		"an invalid header name":     "X Junk: a\r\n",
		"Content-Length repeated":    "Content-Length: 2\r\nContent-Length: 3\r\n",
		"an unknown transfer coding": "Transfer-Encoding: gzip, chunked\r\n",
	}
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/conversations"} {
		for name, h := range headers {
			t.Run(path+"/"+name, func(t *testing.T) {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + h
				if !strings.Contains(h, "Content-Length") && !strings.Contains(h, "Transfer-Encoding") {
					req += "Content-Length: 2\r\n"
				}
				fmt.Fprint(c, req+"\r\n{}")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode < 400 || resp.StatusCode >= 500 && resp.StatusCode != 501 {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				bc := badCase{status: resp.StatusCode, typ: "invalid_request_error", anthropicShape: strings.HasPrefix(path, "/v1/messages")}
				if err := bc.check(resp.StatusCode, resp.Header, b); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
